//! One module per `brink-agent` subcommand: its flags (clap) and the entry that turns them into
//! calls on the library; `up`, `run` and `sweep` live in [`crate::up`], [`crate::cluster`] and
//! [`crate::sweep`]. [`flags`] holds the flags several commands share.

pub mod bench;
pub mod device;
pub mod flags;
pub mod gen_model;
pub mod generate;
pub mod kernels;
pub mod parity;
pub mod qualify;
pub mod selftest;
pub mod serve;
pub mod sweep_report;
