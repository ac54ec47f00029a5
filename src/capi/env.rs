//! `NCCL_*` environment variables, mapped onto ferroccl's [`Config`] (a `FERRO_*` variable wins
//! when both are set).
//!
//! | NCCL variable | effect |
//! |---|---|
//! | `NCCL_DEBUG` (`VERSION`, `WARN`, `INFO`, `TRACE`) | `FERRO_DEBUG` (`WARN`, `WARN`, `INFO`, `DEBUG`) |
//! | `NCCL_SOCKET_IFNAME` | `FERRO_SOCKET_IFNAME` (same syntax) |
//! | `NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`, `NCCL_GRAPH_DUMP_FILE` | `FERRO_TOPO_FILE`, `FERRO_TOPO_DUMP_FILE`, `FERRO_GRAPH_DUMP_FILE` (NCCL topology and graph XML) |
//! | `NCCL_BUFFSIZE` (bytes) | `FERRO_SLICE_BYTES` |
//! | `NCCL_COMM_ID` (`host:port`) | `ncclGetUniqueId` names a store at that address, which rank 0 hosts |
//! | `NCCL_COMM_BLOCKING` (0/1) | default of `ncclConfig_t::blocking` |
//! | `NCCL_SHM_DISABLE` (0/1) | `FERRO_SHM_DISABLE`: `1` leaves shared memory out of `FERRO_TRANSPORTS` (peers on one host use TCP), `0` keeps it |
//! | `NCCL_DEBUG_SUBSYS` | accepted, no effect |
//! | `NCCL_ALGO`, `NCCL_PROTO` | accepted, logged at `INFO`: ferroccl picks its own schedules |

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;

use crate::bootstrap::UniqueId;
use crate::comm::{parse_size, DebugLevel};
use crate::{Config, Error, Result};

/// Reads a variable.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`Lookup`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The value ferroccl's variable `ferro` takes: its own value if set, else the one mapped from
/// its `NCCL_*` counterpart (`None` when that is unset or unusable).
pub fn mapped(env: Lookup<'_>, ferro: &str) -> Option<String> {
    if let Some(v) = env(ferro) {
        return Some(v);
    }
    match ferro {
        "FERRO_DEBUG" => {
            let v = env("NCCL_DEBUG")?;
            let level = match v.trim().to_ascii_uppercase().as_str() {
                "VERSION" | "WARN" | "ABORT" => "WARN",
                "INFO" => "INFO",
                "TRACE" => "DEBUG",
                _ => return None,
            };
            Some(level.into())
        }
        "FERRO_SOCKET_IFNAME" => env("NCCL_SOCKET_IFNAME").filter(|v| !v.trim().is_empty()),
        "FERRO_TOPO_FILE" | "FERRO_TOPO_DUMP_FILE" | "FERRO_GRAPH_DUMP_FILE" => {
            env(&ferro.replace("FERRO_", "NCCL_")).filter(|v| !v.trim().is_empty())
        }
        "FERRO_SLICE_BYTES" => {
            let v = env("NCCL_BUFFSIZE")?;
            match parse_size(&v) {
                Some(n) if n >= 64 => Some(n.to_string()),
                _ => {
                    ferroccl_transport::log_line!("ferroccl (libnccl) WARN NCCL_BUFFSIZE={v:?} ignored: expected a size of at least 64 bytes");
                    None
                }
            }
        }
        "FERRO_SHM_DISABLE" => {
            let v = env("NCCL_SHM_DISABLE")?;
            // NCCL reads an integer: any non-zero value disables shared memory.
            match v.trim().parse::<i64>() {
                Ok(n) => Some(if n != 0 { "1" } else { "0" }.into()),
                Err(_) if v.trim().is_empty() => None,
                Err(_) => {
                    ferroccl_transport::log_line!(
                        "ferroccl (libnccl) WARN NCCL_SHM_DISABLE={v:?} ignored: expected 0 or 1"
                    );
                    None
                }
            }
        }
        _ => None,
    }
}

/// The communicator settings that `env` asks for, `FERRO_*` over `NCCL_*`.
pub fn config_from(env: Lookup<'_>) -> Result<Config> {
    let config = Config::from_lookup(&|k| mapped(env, k))?;
    if config.debug >= DebugLevel::Info {
        for var in ["NCCL_ALGO", "NCCL_PROTO"] {
            if let Some(v) = env(var) {
                ferroccl_transport::log_line!(
                    "ferroccl (libnccl) INFO {var}={v} accepted: ferroccl runs its own ring, chain \
                     and pairwise schedules over TCP"
                );
            }
        }
    }
    Ok(config)
}

/// The settings the process environment asks for.
pub fn config() -> Result<Config> {
    config_from(&process_env)
}

/// Whether `NCCL_COMM_BLOCKING` asks for non-blocking communicators by default.
pub fn default_blocking(env: Lookup<'_>) -> bool {
    env("NCCL_COMM_BLOCKING").is_none_or(|v| v.trim() != "0")
}

/// Whether the library itself prints warnings for failed calls (only when `NCCL_DEBUG` or
/// `FERRO_DEBUG` is set, as NCCL is quiet by default).
pub fn warn_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| process_env("NCCL_DEBUG").is_some() || process_env("FERRO_DEBUG").is_some())
}

/// `NCCL_COMM_ID`: the store address every rank agrees on, and the unique id naming it.
///
/// The id's job magic is derived from the address, so every rank computes the same id without
/// anyone sending it.
pub fn comm_id(env: Lookup<'_>) -> Result<Option<UniqueId>> {
    let Some(spec) = env("NCCL_COMM_ID").filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let addr = resolve(spec.trim())?;
    let magic = crate::comm::hash64(&[b"NCCL_COMM_ID", addr.to_string().as_bytes()]);
    Ok(Some(UniqueId::new(addr, magic)))
}

fn resolve(spec: &str) -> Result<SocketAddr> {
    let bad = |why: String| {
        Error::invalid_argument(format!(
            "NCCL_COMM_ID={spec:?}: {why} (expected host:port or [ipv6]:port)"
        ))
    };
    let mut addrs = spec
        .to_socket_addrs()
        .map_err(|e| bad(format!("cannot resolve: {e}")))?;
    let addr = addrs.next().ok_or_else(|| bad("no address".into()))?;
    if addr.port() == 0 {
        return Err(bad("port 0".into()));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn nccl_names_map_and_ferro_wins() {
        let e = env(&[
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_SOCKET_IFNAME", "=lo"),
            ("NCCL_BUFFSIZE", "1048576"),
        ]);
        let c = config_from(&e).unwrap();
        assert_eq!(c.debug, DebugLevel::Info);
        assert_eq!(c.socket_ifname.as_deref(), Some("=lo"));
        assert_eq!(c.slice_bytes, 1 << 20);
        let e = env(&[("NCCL_DEBUG", "TRACE"), ("FERRO_DEBUG", "WARN")]);
        assert_eq!(config_from(&e).unwrap().debug, DebugLevel::Warn);
        let e = env(&[("NCCL_DEBUG", "TRACE")]);
        assert_eq!(config_from(&e).unwrap().debug, DebugLevel::Debug);
        let e = env(&[("NCCL_BUFFSIZE", "12"), ("NCCL_DEBUG", "bogus")]);
        assert_eq!(config_from(&e).unwrap(), Config::default());
    }

    #[test]
    fn nccl_shm_disable_leaves_shared_memory_out() {
        let default = Config::default().transports;
        assert!(default.iter().any(|t| t == "shm"), "{default:?}");
        let e = env(&[("NCCL_SHM_DISABLE", "1")]);
        assert_eq!(config_from(&e).unwrap().transports, ["tcp"]);
        let e = env(&[("NCCL_SHM_DISABLE", "0")]);
        assert_eq!(config_from(&e).unwrap().transports, default);
        let e = env(&[("NCCL_SHM_DISABLE", " 2 ")]);
        assert_eq!(config_from(&e).unwrap().transports, ["tcp"]);
        // Unusable values are ignored, and ferroccl's own variable wins.
        let e = env(&[("NCCL_SHM_DISABLE", "maybe")]);
        assert_eq!(config_from(&e).unwrap().transports, default);
        let e = env(&[("NCCL_SHM_DISABLE", "1"), ("FERRO_SHM_DISABLE", "0")]);
        assert_eq!(config_from(&e).unwrap().transports, default);
        let e = env(&[("NCCL_SHM_DISABLE", "1"), ("FERRO_TRANSPORTS", "tcp,shm")]);
        assert_eq!(config_from(&e).unwrap().transports, ["tcp"]);
        assert_eq!(mapped(&env(&[]), "FERRO_SHM_DISABLE"), None);
    }

    #[test]
    fn comm_id_is_the_same_on_every_rank() {
        let e = env(&[("NCCL_COMM_ID", "127.0.0.1:29555")]);
        let a = comm_id(&e).unwrap().unwrap();
        let b = comm_id(&e).unwrap().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.addr(), "127.0.0.1:29555".parse().unwrap());
        assert!(comm_id(&env(&[])).unwrap().is_none());
        let err = comm_id(&env(&[("NCCL_COMM_ID", "nohostport")])).unwrap_err();
        assert!(err.message().contains("NCCL_COMM_ID"), "{err}");
        assert!(!default_blocking(&env(&[("NCCL_COMM_BLOCKING", "0")])));
        assert!(default_blocking(&env(&[])));
    }
}
