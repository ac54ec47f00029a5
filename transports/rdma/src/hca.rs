//! `FERRO_IB_HCA`: which devices and ports to use, in NCCL_IB_HCA's syntax. A comma-separated
//! list of `device[:port]`; a device name matches by prefix (`mlx5` takes `mlx5_0` and
//! `mlx5_1`) unless the list starts with `=` (exact names); a list starting with `^` excludes
//! what it names instead (`^=mlx5_0`, `^mlx5_1:2`). No port means every port.

/// One entry of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    device: String,
    port: Option<u8>,
}

/// A parsed `FERRO_IB_HCA`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<Entry>,
}

impl HcaFilter {
    /// Parses `spec`; an empty spec takes every device and port.
    pub fn parse(spec: &str) -> Result<HcaFilter, String> {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let mut entries = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (device, port) = match item.split_once(':') {
                Some((d, p)) => {
                    let port = p
                        .trim()
                        .parse::<u8>()
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| {
                            format!("FERRO_IB_HCA: '{p}' in '{item}' is not a port number (1..255)")
                        })?;
                    (d.trim(), Some(port))
                }
                None => (item, None),
            };
            if device.is_empty() {
                return Err(format!("FERRO_IB_HCA: '{item}' names no device"));
            }
            entries.push(Entry {
                device: device.to_string(),
                port,
            });
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether `device` port `port` may be used.
    pub fn accepts(&self, device: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let named = self.entries.iter().any(|e| {
            let name_ok = if self.exact {
                e.device == device
            } else {
                device.starts_with(&e.device)
            };
            name_ok && e.port.is_none_or(|p| p == port)
        });
        named != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_syntax() {
        let all = HcaFilter::parse("").unwrap();
        assert!(all.accepts("mlx5_0", 1));
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1").unwrap();
        assert!(f.accepts("mlx5_0", 1) && !f.accepts("mlx5_0", 2));
        assert!(f.accepts("mlx5_1", 2) && !f.accepts("mlx4_0", 1));
        assert!(f.accepts("mlx5_10", 1), "prefix match without '='");
        let exact = HcaFilter::parse("=mlx5_1").unwrap();
        assert!(exact.accepts("mlx5_1", 1) && !exact.accepts("mlx5_10", 1));
        let ex = HcaFilter::parse("^mlx5_0:1").unwrap();
        assert!(!ex.accepts("mlx5_0", 1) && ex.accepts("mlx5_0", 2) && ex.accepts("soft0", 1));
        let exex = HcaFilter::parse("^=soft0").unwrap();
        assert!(!exex.accepts("soft0", 1) && exex.accepts("soft01", 1));
        let e = HcaFilter::parse("mlx5_0:x").unwrap_err();
        assert!(e.contains("'x'") && e.contains("FERRO_IB_HCA"), "{e}");
        assert!(HcaFilter::parse(":1").is_err());
    }
}
