//! The one error type shared by every layer of ferroccl.
//!
//! Errors are values that can be cloned: a communicator keeps the first
//! asynchronous error it sees and returns it from every later call.

use std::fmt;

/// What went wrong, in the categories NCCL's `ncclResult_t` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A caller passed a bad argument (null buffer, bad dtype, root out of range, ...). Fix the call.
    InvalidArgument,
    /// The call is not allowed in this state (communicator failed, wrong group nesting, ...).
    InvalidUsage,
    /// The operating system refused something (socket, memory, thread). The message names the call.
    System,
    /// A peer failed, disconnected, or disagrees about the operation. The message names the peer.
    Remote,
    /// A wait passed its deadline (`FERRO_TIMEOUT`). The message names the operation and the peer.
    Timeout,
    /// The communicator was aborted.
    Aborted,
    /// A bug in ferroccl. Please report it with the message.
    Internal,
    /// Something optional (CUDA, a transport) is not available here.
    Unsupported,
}

impl ErrorKind {
    /// A short lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidUsage => "invalid usage",
            ErrorKind::System => "system error",
            ErrorKind::Remote => "remote error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Aborted => "aborted",
            ErrorKind::Internal => "internal error",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

/// A ferroccl error: a kind and a message naming the operation, ranks and values involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// The peer whose connection failed, when the error comes from one.
    peer: Option<usize>,
    /// The rank where the failure began and its own words, when a peer passed them on.
    origin: Option<(usize, String)>,
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            peer: None,
            origin: None,
        }
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for [`ErrorKind::InvalidUsage`].
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidUsage, message)
    }

    /// Shorthand for [`ErrorKind::Remote`].
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Remote, message)
    }

    /// Shorthand for [`ErrorKind::Timeout`].
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// A system error from an `io::Error`, with what was being done.
    pub fn io(context: impl fmt::Display, err: &std::io::Error) -> Self {
        Self::new(ErrorKind::System, format!("{context}: {err}"))
    }

    /// The category.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the category.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The peer whose connection failed, when the error comes from one.
    pub fn peer(&self) -> Option<usize> {
        self.peer
    }

    /// The same error, attributed to the connection to `peer`.
    pub fn with_peer(mut self, peer: usize) -> Self {
        self.peer = Some(peer);
        self
    }

    /// The rank where the failure began and what it reported, when this error was passed on
    /// by a peer (the first cause, as NCCL's asynchronous error keeps it).
    pub fn origin(&self) -> Option<(usize, &str)> {
        self.origin.as_ref().map(|(r, why)| (*r, why.as_str()))
    }

    /// The same error, recording that the failure began on `rank`, which reported `why`.
    pub fn with_origin(mut self, rank: usize, why: impl Into<String>) -> Self {
        self.origin = Some((rank, why.into()));
        self
    }

    /// The same error with `more` appended to the message (`"message; more"`).
    pub fn append(mut self, more: impl fmt::Display) -> Self {
        self.message = format!("{}; {more}", self.message);
        self
    }

    /// The same error with `context` put in front of the message (`"context: message"`).
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.as_str())
    }
}

impl std::error::Error for Error {}

/// `Result` with ferroccl's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_message() {
        let e = Error::remote("rank 3 closed the connection").context("all_reduce #4");
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert_eq!(
            e.to_string(),
            "all_reduce #4: rank 3 closed the connection (remote error)"
        );
    }
}
