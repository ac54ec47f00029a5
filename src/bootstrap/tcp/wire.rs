//! Encoding and decoding of hellos and frames: no I/O.

use super::{MAX_KEY_LEN, MAX_VALUE_LEN, PROTOCOL_VERSION};

pub(super) const MAGIC: [u8; 8] = *b"FRCLSTOR";
pub(super) const HELLO_LEN: usize = 20;
pub(super) const REPLY_LEN: usize = 12;
/// The largest frame body either side accepts.
pub(super) const MAX_FRAME: usize = MAX_VALUE_LEN + MAX_KEY_LEN + 16;

pub(super) const HELLO_OK: u16 = 0;
pub(super) const HELLO_BAD_VERSION: u16 = 1;
pub(super) const HELLO_BAD_MAGIC: u16 = 2;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;

const ST_OK: u8 = 0;
const ST_TIMED_OUT: u8 = 1;
const ST_FAILED: u8 = 2;
const ST_CLOSING: u8 = 3;

pub(super) fn hello(job_magic: u64) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&job_magic.to_le_bytes());
    h
}

/// `(version, job magic)` of a hello, `None` when it is not a ferroccl store hello.
pub(super) fn parse_hello(h: &[u8; HELLO_LEN]) -> Option<(u16, u64)> {
    if h[..8] != MAGIC || h[10..12] != [0, 0] {
        return None;
    }
    Some((u16_at(h, 8), u64_at(h, 12)))
}

pub(super) fn reply(status: u16) -> [u8; REPLY_LEN] {
    let mut r = [0u8; REPLY_LEN];
    r[..8].copy_from_slice(&MAGIC);
    r[8..10].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    r[10..12].copy_from_slice(&status.to_le_bytes());
    r
}

/// `(version, status)` of a server's reply, `None` when it is not from a ferroccl store.
pub(super) fn parse_reply(r: &[u8; REPLY_LEN]) -> Option<(u16, u16)> {
    (r[..8] == MAGIC).then(|| (u16_at(r, 8), u16_at(r, 10)))
}

/// Whether the first bytes of an answer may still be a ferroccl store's reply.
pub(super) fn could_be_reply(start: &[u8]) -> bool {
    let n = start.len().min(MAGIC.len());
    start[..n] == MAGIC[..n]
}

/// A client's request.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Request<'a> {
    Set { key: &'a str, value: &'a [u8] },
    Get { key: &'a str, wait_ms: u64 },
    Add { key: &'a str, delta: i64 },
}

/// A server's response.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Response {
    /// Done; the value (GET), the new count (ADD, 8 bytes) or nothing (SET).
    Done(Vec<u8>),
    TimedOut,
    /// The request failed: whether the cause is a bad argument (else bad usage), why.
    Failed {
        bad_argument: bool,
        message: String,
    },
    Closing,
}

/// The request as a frame, length prefix included.
pub(super) fn encode_request(req: &Request<'_>) -> Vec<u8> {
    let mut body = Vec::new();
    match *req {
        Request::Set { key, value } => {
            body.push(OP_SET);
            body.extend_from_slice(&len_u32(key.len()).to_le_bytes());
            body.extend_from_slice(key.as_bytes());
            body.extend_from_slice(value);
        }
        Request::Get { key, wait_ms } => {
            body.push(OP_GET);
            body.extend_from_slice(&wait_ms.to_le_bytes());
            body.extend_from_slice(key.as_bytes());
        }
        Request::Add { key, delta } => {
            body.push(OP_ADD);
            body.extend_from_slice(&delta.to_le_bytes());
            body.extend_from_slice(key.as_bytes());
        }
    }
    frame(body)
}

/// Decodes a request frame's body; the error says what is wrong with it.
pub(super) fn decode_request(body: &[u8]) -> Result<Request<'_>, String> {
    fn key(b: &[u8]) -> Result<&str, String> {
        if b.len() > MAX_KEY_LEN {
            return Err(format!("key of {} bytes (at most {MAX_KEY_LEN})", b.len()));
        }
        std::str::from_utf8(b).map_err(|_| "key is not UTF-8".to_string())
    }
    let (&op, rest) = body.split_first().ok_or("empty request")?;
    match op {
        OP_SET => {
            let klen = u32_prefix(rest).ok_or("short SET")? as usize;
            let rest = &rest[4..];
            if klen > rest.len() {
                return Err(format!("SET key length {klen} past the frame end"));
            }
            let (k, value) = rest.split_at(klen);
            Ok(Request::Set {
                key: key(k)?,
                value,
            })
        }
        OP_GET if rest.len() >= 8 => Ok(Request::Get {
            wait_ms: u64_at(rest, 0),
            key: key(&rest[8..])?,
        }),
        OP_ADD if rest.len() >= 8 => Ok(Request::Add {
            delta: u64_at(rest, 0) as i64,
            key: key(&rest[8..])?,
        }),
        OP_GET | OP_ADD => Err("short request".into()),
        _ => Err(format!("unknown opcode {op}")),
    }
}

/// The response as a frame, length prefix included.
pub(super) fn encode_response(resp: &Response) -> Vec<u8> {
    let body = match resp {
        Response::Done(payload) => {
            let mut b = Vec::with_capacity(1 + payload.len());
            b.push(ST_OK);
            b.extend_from_slice(payload);
            b
        }
        Response::TimedOut => vec![ST_TIMED_OUT],
        Response::Failed {
            bad_argument,
            message,
        } => {
            let mut b = vec![ST_FAILED, u8::from(*bad_argument)];
            b.extend_from_slice(message.as_bytes());
            b
        }
        Response::Closing => vec![ST_CLOSING],
    };
    frame(body)
}

pub(super) fn decode_response(mut body: Vec<u8>) -> Result<Response, String> {
    match body.first().copied() {
        Some(ST_OK) => {
            body.remove(0);
            Ok(Response::Done(body))
        }
        Some(ST_TIMED_OUT) => Ok(Response::TimedOut),
        Some(ST_FAILED) if body.len() >= 2 => Ok(Response::Failed {
            bad_argument: body[1] != 0,
            message: String::from_utf8_lossy(&body[2..]).into_owned(),
        }),
        Some(ST_CLOSING) => Ok(Response::Closing),
        Some(s) => Err(format!("unknown response status {s}")),
        None => Err("empty response".into()),
    }
}

/// The length a frame header announces, `None` if more than [`MAX_FRAME`].
pub(super) fn frame_len(header: [u8; 4]) -> Option<usize> {
    let n = u32::from_le_bytes(header) as usize;
    (n <= MAX_FRAME).then_some(n)
}

fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + body.len());
    f.extend_from_slice(&len_u32(body.len()).to_le_bytes());
    f.extend_from_slice(&body);
    f
}

/// `n` as `u32`. Callers keep frames within [`MAX_FRAME`], far below `u32::MAX`.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn u32_prefix(b: &[u8]) -> Option<u32> {
    b.get(..4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}
