//! What becomes of a request that was running when the engine died or stalled (pure; the
//! supervisor acts on it). Its KV died with the child, but if its client has received nothing
//! yet the request can run again on the restarted engine and the client never sees the
//! restart: a non-streaming answer is only sent whole at the end, and a stream that produced no
//! token has sent no output (the headers and the opening frame carry no generated text).
//! A stream that already sent tokens cannot be replayed without repeating them, so it gets the
//! error. Each request is run again at most `limit` times, so a prompt that kills every engine
//! it meets cannot keep the server restarting (the poison quarantine still judges its shape
//! before it runs again).

/// A request in flight when the engine went, as far as its client is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub stream: bool,
    /// Tokens generated (and, for a stream, sent) in this run.
    pub generated: u64,
    /// Times it was already run again after a restart.
    pub requeued: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterRestart {
    /// Run it again from its prompt; its client has seen no output.
    Requeue,
    /// A stream already sent tokens: it ends with the error.
    Streamed,
    /// It was run again `limit` times already: it ends with the error.
    LimitReached,
}

pub fn after_restart(f: InFlight, limit: u32) -> AfterRestart {
    if f.stream && f.generated > 0 {
        AfterRestart::Streamed
    } else if f.requeued >= limit {
        AfterRestart::LimitReached
    } else {
        AfterRestart::Requeue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_whose_client_saw_no_output_run_again_and_only_up_to_the_limit() {
        use AfterRestart::*;
        let f = |stream, generated, requeued| InFlight { stream, generated, requeued };
        let cases = [
            // (in flight, limit, expected)
            (f(false, 0, 0), 1, Requeue),
            // A non-streaming answer is sent whole at the end: tokens so far are not output yet.
            (f(false, 7, 0), 1, Requeue),
            (f(true, 0, 0), 1, Requeue),
            (f(true, 1, 0), 1, Streamed),
            (f(true, 5, 1), 1, Streamed),
            (f(false, 0, 1), 1, LimitReached),
            (f(true, 0, 1), 1, LimitReached),
            (f(false, 3, 1), 2, Requeue),
            (f(false, 0, 2), 2, LimitReached),
            // Limit 0 turns re-queueing off: every request in flight gets the error.
            (f(false, 0, 0), 0, LimitReached),
            (f(true, 0, 0), 0, LimitReached),
        ];
        for (inflight, limit, want) in cases {
            assert_eq!(after_restart(inflight, limit), want, "{inflight:?} limit {limit}");
        }
    }
}
