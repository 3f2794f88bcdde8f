//! A stream recording made into a CUDA graph whose kernel-to-kernel edges may be programmatic.
//!
//! A decode step is hundreds of small kernels in a chain; with ordinary edges each one is
//! launched only after the one before has drained, so the GPU idles for a launch latency at
//! every edge. With [`KernelOverlap::Start`] every edge between two kernel nodes becomes a
//! programmatic dependency from the upstream's launch-completion port: the next kernel may be
//! scheduled once every block of the one before has started, and its first statement
//! (`GRID_DEPENDENCY_WAIT()` in `cuda/common.cuh`, which every kernel begins with and
//! `sources` tests check) holds it until the one before has finished and its writes are
//! visible. So the ordering of memory is exactly that of the plain chain; only the launch
//! latency is hidden. Edges to or from other nodes keep their ordinary kind.
//!
//! [`KernelOverlap::Exit`] is the default where the device has programmatic edges: measured on
//! an H100 against ordinary edges with the same binary (docs/perf-notes.md, entry 11), decode
//! 232.4 -> 238.1 tok/s for one sequence and 679.1 -> 685.2 for eight; `Start` was slower
//! (224.0 and 638.9; entry 10 too). `BRINK_GRAPH_OVERLAP=off|start|exit` picks one to measure.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode, CUgraphNodeType};
use cudarc::driver::{CudaStream, DriverError};

/// How the kernels of a replayed graph follow one another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelOverlap {
    /// Ordinary edges: a kernel is launched after the one before has finished (devices below
    /// compute capability 9.0 always).
    Off,
    /// Programmatic edges from the launch-completion port (module doc). Needs compute
    /// capability 9.0 (Hopper, GB10); older devices get [`KernelOverlap::Off`].
    Start,
    /// Programmatic edges from the programmatic port: no kernel triggers its dependents, so
    /// the next kernel is scheduled when every block of the one before has exited, without
    /// waiting for the grid's completion to be processed, and no block spins meanwhile (the
    /// default from compute capability 9.0).
    Exit,
}

impl KernelOverlap {
    /// From `BRINK_GRAPH_OVERLAP` (`off`, `start` or `exit`; unset: `exit`) and the device's compute
    /// capability; an unknown value is an error naming it.
    pub fn choose(env: Option<&str>, compute_capability: (u32, u32)) -> Result<KernelOverlap, String> {
        let wanted = match env.map(str::trim) {
            None | Some("") | Some("exit") => KernelOverlap::Exit,
            Some("off") => KernelOverlap::Off,
            Some("start") => KernelOverlap::Start,
            Some(other) => return Err(format!("BRINK_GRAPH_OVERLAP={other:?}: expected \"off\", \"start\" or \"exit\"")),
        };
        Ok(if compute_capability.0 >= 9 { wanted } else { KernelOverlap::Off })
    }
}

/// An instantiated graph, replayed on the stream it was captured from.
pub struct StepGraph {
    graph: CUgraph,
    exec: CUgraphExec,
    stream: Arc<CudaStream>,
    /// Edges made programmatic (0 with [`KernelOverlap::Off`]).
    pub programmatic_edges: usize,
}

// SAFETY: the handles are only used through the owning stream's context, which `launch`
// binds; cudarc's own graph type is Send and Sync on the same grounds.
unsafe impl Send for StepGraph {}
unsafe impl Sync for StepGraph {}

impl Drop for StepGraph {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: both handles were created by `end_capture` and are destroyed once, here.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// The failing call and its error.
pub type GraphError = (&'static str, DriverError);

impl StepGraph {
    /// Ends the capture running on `stream` and instantiates it, converting the edges as
    /// `overlap` says. On any failure the recording is destroyed and the call named.
    pub fn end_capture(stream: &Arc<CudaStream>, overlap: KernelOverlap) -> Result<Option<StepGraph>, GraphError> {
        stream.context().bind_to_thread().map_err(|e| ("cuCtxSetCurrent", e))?;
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stream is capturing (the caller began it).
        unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }.result().map_err(|e| ("cuStreamEndCapture", e))?;
        if graph.is_null() {
            return Ok(None);
        }
        let destroy = |g: CUgraph| {
            // SAFETY: `g` came from cuStreamEndCapture and is not used afterwards.
            let _ = unsafe { sys::cuGraphDestroy(g) };
        };
        let port = match overlap {
            KernelOverlap::Off => None,
            KernelOverlap::Start => Some(sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER),
            KernelOverlap::Exit => Some(sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC),
        };
        let programmatic_edges = match port {
            None => 0,
            // SAFETY: `graph` is a valid graph owned here.
            Some(port) => match unsafe { make_kernel_edges_programmatic(graph, programmatic_edge(port)) } {
                Ok(n) => n,
                Err(e) => {
                    destroy(graph);
                    return Err(e);
                }
            },
        };
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: valid out-pointer and graph.
        if let Err(e) = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result() {
            destroy(graph);
            return Err(("cuGraphInstantiateWithFlags", e));
        }
        Ok(Some(StepGraph { graph, exec, stream: stream.clone(), programmatic_edges }))
    }

    /// Runs the graph on its stream (asynchronously, like a launch).
    pub fn launch(&self) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: a valid executable graph and stream.
        unsafe { sys::cuGraphLaunch(self.exec, self.stream.cu_stream()) }.result()
    }
}

fn is_kernel(node: CUgraphNode) -> Result<bool, GraphError> {
    let mut ty = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: a node of a live graph, valid out-pointer.
    unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result().map_err(|e| ("cuGraphNodeGetType", e))?;
    Ok(ty == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
}

/// A programmatic edge leaving the upstream kernel from `port`.
pub fn programmatic_edge(port: u32) -> CUgraphEdgeData {
    CUgraphEdgeData {
        from_port: port as u8,
        to_port: 0,
        type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        reserved: [0; 5],
    }
}

/// Replaces every ordinary kernel-to-kernel edge of `graph` by a programmatic one; returns how
/// many. Each edge is removed and added back in one step, so a failure leaves at most that
/// edge missing, and the caller then destroys the graph.
///
/// # Safety
/// `graph` must be a valid graph that nothing else uses meanwhile.
unsafe fn make_kernel_edges_programmatic(graph: CUgraph, edge: CUgraphEdgeData) -> Result<usize, GraphError> {
    let mut n = 0usize;
    // SAFETY (this block): counting call with null arrays, then arrays of that length.
    unsafe { sys::cuGraphGetEdges_v2(graph, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut n) }
        .result()
        .map_err(|e| ("cuGraphGetEdges", e))?;
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    let mut data = vec![CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] }; n];
    unsafe { sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut n) }
        .result()
        .map_err(|e| ("cuGraphGetEdges", e))?;
    let mut converted = 0;
    for i in 0..n {
        let ordinary = data[i].type_ == sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8 && data[i].from_port == 0;
        if !ordinary || !is_kernel(from[i])? || !is_kernel(to[i])? {
            continue;
        }
        unsafe { sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1) }
            .result()
            .map_err(|e| ("cuGraphRemoveDependencies", e))?;
        unsafe { sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &edge, 1) }.result().map_err(|e| ("cuGraphAddDependencies", e))?;
        converted += 1;
    }
    Ok(converted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_off_unless_asked_and_only_on_hopper_and_later() {
        assert_eq!(KernelOverlap::choose(None, (9, 0)), Ok(KernelOverlap::Exit));
        assert_eq!(KernelOverlap::choose(None, (12, 1)), Ok(KernelOverlap::Exit));
        assert_eq!(KernelOverlap::choose(None, (8, 9)), Ok(KernelOverlap::Off));
        assert_eq!(KernelOverlap::choose(Some("start"), (9, 0)), Ok(KernelOverlap::Start));
        assert_eq!(KernelOverlap::choose(Some("start"), (12, 1)), Ok(KernelOverlap::Start));
        assert_eq!(KernelOverlap::choose(Some("start"), (8, 9)), Ok(KernelOverlap::Off));
        assert_eq!(KernelOverlap::choose(Some("off"), (9, 0)), Ok(KernelOverlap::Off));
        let e = KernelOverlap::choose(Some("on"), (9, 0)).unwrap_err();
        assert!(e.contains("BRINK_GRAPH_OVERLAP") && e.contains("\"on\""), "{e}");
    }

    #[test]
    fn programmatic_edges_leave_from_the_ports_of_the_cuda_headers() {
        let start = programmatic_edge(sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER);
        let exit = programmatic_edge(sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC);
        assert_eq!((start.from_port, exit.from_port), (2, 1));
        assert_eq!((start.type_, start.to_port, exit.type_), (1, 0, 1));
        assert_eq!(KernelOverlap::choose(Some("exit"), (9, 0)), Ok(KernelOverlap::Exit));
    }
}
