//! The engine child process on its own, for the engine crate's tests (they cannot build
//! `brink-agent`, which depends on this crate). In production `brink-agent engine-child` runs
//! the same code. Speaks the supervisor's protocol on stdin/stdout; not for direct use.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(brink_engine::server::child::main_stdio() as u8)
}
