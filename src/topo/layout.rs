//! Where ranks live: which host each rank is on, as the hierarchical and tree algorithms see it
//! (re-exported as `coll::Topology`).
#![forbid(unsafe_code)]

/// The host of every rank. Ranks of a host are taken in rank order; a rank's local rank is its
/// index among the ranks of its host. Hosts are ordered by their index in `host_of`; indices
/// that no rank uses are skipped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Topology {
    /// `host_of[r]`: the host index of rank `r`.
    pub host_of: Vec<usize>,
}

impl Topology {
    /// `nranks` ranks on one host.
    pub fn single_host(nranks: usize) -> Self {
        Topology {
            host_of: vec![0; nranks],
        }
    }

    /// `nranks` ranks, `per_host` consecutive ranks per host (the last host may have fewer).
    /// A `per_host` of 0 counts as 1.
    pub fn uniform(nranks: usize, per_host: usize) -> Self {
        let k = per_host.max(1);
        Topology {
            host_of: (0..nranks).map(|r| r / k).collect(),
        }
    }

    /// Ranks in the topology.
    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    /// The ranks of every host, hosts in index order, ranks in rank order.
    pub fn hosts(&self) -> Vec<Vec<usize>> {
        let mut ids: Vec<usize> = self.host_of.clone();
        ids.sort_unstable();
        ids.dedup();
        let mut hosts = vec![Vec::new(); ids.len()];
        for (r, h) in self.host_of.iter().enumerate() {
            // `ids` holds every value of `host_of`, so the search always succeeds.
            if let Ok(i) = ids.binary_search(h) {
                hosts[i].push(r);
            }
        }
        hosts
    }

    /// Hosts with at least one rank.
    pub fn nhosts(&self) -> usize {
        self.hosts().len()
    }

    /// Whether every host has the same number of ranks.
    pub fn is_uniform(&self) -> bool {
        let hosts = self.hosts();
        hosts.windows(2).all(|w| w[0].len() == w[1].len())
    }

    /// Whether ranks `a` and `b` are on one host.
    pub fn same_host(&self, a: usize, b: usize) -> bool {
        self.host_of.get(a).is_some() && self.host_of.get(a) == self.host_of.get(b)
    }

    /// Checks that the topology describes `nranks` ranks.
    pub fn validate(&self, nranks: usize) -> Result<(), String> {
        if self.host_of.len() != nranks {
            return Err(format!(
                "topology describes {} ranks, the call has {nranks}",
                self.host_of.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_host_and_uniform_layouts() {
        let one = Topology::single_host(3);
        assert_eq!(one.nranks(), 3);
        assert_eq!(one.hosts(), vec![vec![0, 1, 2]]);
        assert!(one.is_uniform());

        let u = Topology::uniform(7, 3);
        assert_eq!(u.host_of, vec![0, 0, 0, 1, 1, 1, 2]);
        assert_eq!(u.nhosts(), 3);
        assert!(!u.is_uniform());
        assert_eq!(Topology::uniform(4, 0), Topology::uniform(4, 1));
        assert_eq!(Topology::uniform(0, 8).nhosts(), 0);
    }

    #[test]
    fn hosts_are_ordered_by_index_and_unused_indices_skipped() {
        let t = Topology {
            host_of: vec![5, 2, 5, 2, 9],
        };
        assert_eq!(t.hosts(), vec![vec![1, 3], vec![0, 2], vec![4]]);
        assert_eq!(t.nhosts(), 3);
        assert!(!t.is_uniform());
    }

    #[test]
    fn same_host_and_validate() {
        let t = Topology::uniform(4, 2);
        assert!(t.same_host(0, 1));
        assert!(!t.same_host(1, 2));
        assert!(!t.same_host(0, 4));
        assert!(!t.same_host(4, 4));
        assert!(t.validate(4).is_ok());
        let e = t.validate(5).unwrap_err();
        assert_eq!(e, "topology describes 4 ranks, the call has 5");
    }
}
