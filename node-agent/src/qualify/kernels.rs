//! The kernel threshold self-test as `up` runs it: in a child process (`__selftest-worker`),
//! with a progress bar, for the model's own shape class.

use std::process::Command;

use brink_api::selftest::{CaseResult, SelfTestReport};
use brink_engine::model::ModelConfig;
use brink_kernels::selftest::runner::Runner;
use brink_kernels::selftest::session::{self, Options, Progress};
use brink_kernels::thresholds::{AttentionShape, ModelShape};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The kernels' view of a model: its shape class, with the latent projection of the design's
/// third failure kept (it carries the tail-skip negative control, which every run needs).
pub fn shape_of(c: &ModelConfig) -> ModelShape {
    let reference = ModelShape::qwen3_30b_a3b();
    let sat = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    ModelShape {
        name: c.shape_class(),
        hidden: sat(c.hidden),
        experts: sat(c.moe.experts),
        top_k: sat(c.moe.top_k),
        expert_ffn: sat(c.moe.expert_ffn),
        vocab: sat(c.vocab),
        context: sat(c.context),
        attention: AttentionShape {
            heads: sat(c.attention.heads),
            kv_heads: sat(c.attention.kv_heads),
            head_dim: sat(c.attention.head_dim),
            rope_theta: c.attention.rope_theta,
            norm_eps: c.norm_eps,
        },
        latent: reference.latent,
    }
}

/// Runs the self-test with `opts` in worker processes of this executable.
pub fn run(opts: &Options) -> Result<SelfTestReport, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable to start the self-test worker: {e}"))?;
    let mut runner = Runner::new(move || {
        let mut c = Command::new(&exe);
        c.arg("__selftest-worker");
        c
    });
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} kernel self-test {pos}/{len} [{elapsed}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.set_message("opening the GPU and compiling kernels");
    let report = session::run(&mut runner, opts, &mut |p| match p {
        Progress::Derived { cases, .. } => bar.set_length(cases as u64),
        Progress::Case { index, report, .. } => {
            bar.set_position(index as u64 + 1);
            bar.set_message(report.id.clone());
            if matches!(report.result, CaseResult::Failed | CaseResult::Hung | CaseResult::Missed) {
                bar.println(format!("{:?} {}: {}", report.result, report.id, report.detail));
            }
        }
    });
    bar.finish_and_clear();
    Ok(report)
}
