//! What the engine tells the watchdog, and the test-only faults it can be made to hit.
//!
//! - [`board`]: the progress board (step, layer, op, batch shape, device progress) in memory
//!   shared with the supervisor.
//! - [`fault`]: `hang`/`fail` at a chosen layer, for the watchdog's tests.
//!
//! A backend holds an `Arc<Monitor>`; the model graph reports each op through
//! `Backend::mark`, which updates the board and, when a fault is armed, fires it.

pub mod board;
pub mod fault;

pub use board::{BoardFile, Op, ProgressBoard, Snapshot, Stuck};
pub use fault::{Fault, FaultKind, INJECTED_KERNEL, injected_launch_error};

enum Board {
    Local(ProgressBoard),
    Shared(BoardFile),
}

/// The board a backend reports to, and the fault it is armed with.
pub struct Monitor {
    board: Board,
    fault: Option<Fault>,
}

impl Monitor {
    /// A board in this process (an engine with no supervisor).
    pub fn local() -> Monitor {
        Monitor { board: Board::Local(ProgressBoard::new()), fault: None }
    }

    /// The supervisor's board, mapped from its file.
    pub fn shared(file: BoardFile) -> Monitor {
        Monitor { board: Board::Shared(file), fault: None }
    }

    pub fn with_fault(mut self, fault: Option<Fault>) -> Monitor {
        self.fault = fault;
        self
    }

    pub fn board(&self) -> &ProgressBoard {
        match &self.board {
            Board::Local(b) => b,
            Board::Shared(f) => f.board(),
        }
    }

    /// A supervisor reads this board (the engine runs as its child).
    pub fn is_shared(&self) -> bool {
        matches!(self.board, Board::Shared(_))
    }

    pub fn fault(&self) -> Option<Fault> {
        self.fault
    }

    /// The fault to inject as `layer` of a step of `rows` rows starts.
    pub fn fault_at(&self, layer: u32, rows: u64) -> Option<FaultKind> {
        self.fault.and_then(|f| f.fires(layer, rows))
    }

    /// The graph enters `op` (of `layer`) in a step of `rows` rows: the board says so, and the
    /// armed fault, if this is the first op of its layer and the step is large enough, is
    /// returned for the backend to fire its own way.
    pub fn enter(&self, layer: Option<u32>, op: Op, rows: u64) -> Option<FaultKind> {
        self.board().enter(layer, op);
        match (layer, op) {
            (Some(l), Op::AttnNorm) => self.fault_at(l, rows),
            _ => None,
        }
    }
}

/// The CPU form of an injected hang: this thread never returns, as a deadlocked kernel never
/// would; only killing the process ends it.
pub fn block_forever() -> ! {
    loop {
        std::thread::park();
    }
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::local()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_at_the_first_op_of_their_layer_only() {
        let m = Monitor::local().with_fault(Some("fail:layer=1,min-rows=8".parse().unwrap()));
        assert_eq!(m.enter(Some(1), Op::AttnNorm, 8), Some(FaultKind::Fail));
        assert_eq!(m.enter(Some(1), Op::Moe, 8), None);
        assert_eq!(m.enter(Some(1), Op::AttnNorm, 7), None);
        assert_eq!(m.enter(Some(0), Op::AttnNorm, 8), None);
        assert_eq!(m.board().snapshot().layer, Some(0));
        assert_eq!(Monitor::local().enter(Some(1), Op::AttnNorm, 8), None);
    }
}
