//! The kernel threshold self-test as `selftest` and `up` run it: in a child process
//! (`__selftest-worker`) of this executable, with a progress bar on stderr.

use std::io::IsTerminal;
use std::process::Command;

use brink_api::selftest::{CaseResult, SelfTestReport};
use brink_kernels::selftest::runner::Runner;
use brink_kernels::selftest::session::{self, Options, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The self-test cannot start: this executable, which its workers run, cannot be found.
#[derive(Debug, thiserror::Error)]
#[error("cannot find this executable to start the self-test worker: {0}")]
pub struct NoWorker(#[source] pub std::io::Error);

/// Runs the self-test with `opts` in worker processes of this executable.
pub fn run(opts: &Options) -> Result<SelfTestReport, NoWorker> {
    let exe = std::env::current_exe().map_err(NoWorker)?;
    let mut runner = Runner::new(move || {
        let mut c = Command::new(&exe);
        c.arg("__selftest-worker");
        c
    });
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} self-test {pos}/{len} [{elapsed}] {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.set_message("opening the GPU and compiling kernels");
    let (tty, t0) = (std::io::stderr().is_terminal(), std::time::Instant::now());
    let report = session::run(&mut runner, opts, &mut |p| match p {
        Progress::Derived { cases, .. } => bar.set_length(cases as u64),
        Progress::Case { index, total, report } => {
            bar.set_position(index as u64 + 1);
            bar.set_message(report.id.clone());
            // Without a terminal the bar draws nothing: a line every 100 cases shows progress.
            if !tty && (index + 1) % 100 == 0 {
                eprintln!("self-test {}/{total} {} [{:.0} s]", index + 1, report.id, t0.elapsed().as_secs_f64());
            }
            if matches!(report.result, CaseResult::Failed | CaseResult::Hung | CaseResult::Missed) {
                bar.println(format!("{:?} {}: {}", report.result, report.id, report.detail));
            }
        }
    });
    bar.finish_and_clear();
    Ok(report)
}
