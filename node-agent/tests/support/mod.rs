//! Test-only servers the CLI tests run against.
#![allow(dead_code)]

pub mod standin;
