//! Codes carried in message headers, with their names: one table for the whole crate.
//!
//! | code space | carried in   | values                                            |
//! |------------|--------------|---------------------------------------------------|
//! | [`kind`]   | `Header.kind`| which operation a message belongs to (1..=13)     |
//! | [`op`]     | `Header.op`  | the reduction, NCCL's `ncclRedOp_t` numbering; [`op::NONE`] when the operation does not reduce |
//!
//! Peers compare headers byte for byte, so a code here never changes meaning once released.

/// Operation kinds as carried in message headers.
pub(crate) mod kind {
    pub const ALL_REDUCE: u8 = 1;
    pub const BROADCAST: u8 = 2;
    pub const REDUCE: u8 = 3;
    pub const ALL_GATHER: u8 = 4;
    pub const REDUCE_SCATTER: u8 = 5;
    pub const ALL_TO_ALL: u8 = 6;
    pub const SEND_RECV: u8 = 7;
    pub const SPLIT: u8 = 8;
    pub const BARRIER: u8 = 9;
    /// Gather and scatter, built from sends and receives (their root agreement carries it).
    pub const GATHER: u8 = 10;
    pub const SCATTER: u8 = 11;
    /// A failure notice: a failing rank's last message on a connection before it closes it.
    /// `root` names the rank where the failure began; the payload is that rank's reason.
    pub const NOTICE: u8 = 12;
    /// A window's registration and deregistration (the exchange of the ranks' buffers).
    pub const WINDOW: u8 = 13;

    /// Name of a header kind.
    pub fn name(k: u8) -> &'static str {
        match k {
            ALL_REDUCE => "all_reduce",
            BROADCAST => "broadcast",
            REDUCE => "reduce",
            ALL_GATHER => "all_gather",
            REDUCE_SCATTER => "reduce_scatter",
            ALL_TO_ALL => "all_to_all",
            SEND_RECV => "send/recv",
            SPLIT => "split",
            BARRIER => "barrier",
            GATHER => "gather",
            SCATTER => "scatter",
            NOTICE => "failure notice",
            WINDOW => "window registration",
            _ => "unknown operation",
        }
    }
}

/// Reduction codes as carried in message headers (NCCL's `ncclRedOp_t` values; 5 for
/// pre-multiplied sums).
pub(crate) mod op {
    pub const SUM: u8 = 0;
    pub const PROD: u8 = 1;
    pub const MAX: u8 = 2;
    pub const MIN: u8 = 3;
    pub const AVG: u8 = 4;
    pub const PREMUL_SUM: u8 = 5;
    /// The operation does not reduce.
    pub const NONE: u8 = 0xff;

    /// Name of a reduction code, as nccl-tests prints it.
    pub fn name(code: u8) -> &'static str {
        match code {
            SUM => "sum",
            PROD => "prod",
            MAX => "max",
            MIN => "min",
            AVG => "avg",
            PREMUL_SUM => "premulsum",
            _ => "none",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_name() {
        let kinds: Vec<&str> = (1..=12).map(kind::name).collect();
        for (i, a) in kinds.iter().enumerate() {
            assert_ne!(*a, "unknown operation");
            assert!(!kinds[i + 1..].contains(a), "{a} named twice");
        }
        let ops: Vec<&str> = (op::SUM..=op::PREMUL_SUM).map(op::name).collect();
        assert_eq!(ops, ["sum", "prod", "max", "min", "avg", "premulsum"]);
        assert_eq!(op::name(op::NONE), "none");
    }
}
