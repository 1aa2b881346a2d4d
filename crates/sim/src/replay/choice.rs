//! The node-side policies one replay applies to every file: the
//! catalogue's write, replacement, prefetch, consistency and cooperative
//! keys (DESIGN.md §3), written as `parcache policy set` takes them.

use parcache_core::cooperative::CooperativeKind;
use parcache_core::{ConsistencyKind, FilePolicies, PrefetchKind, ReplacementKind, WritePolicyKind};
use std::fmt;

/// One combination of policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Choice {
    pub write: WritePolicyKind,
    pub replacement: ReplacementKind,
    pub prefetch: PrefetchKind,
    pub consistency: ConsistencyKind,
    pub cooperative: CooperativeKind,
}

impl Default for Choice {
    /// A new file's policies in parcache (`FilePolicies::default`).
    fn default() -> Self {
        let p = FilePolicies::default();
        Choice {
            write: p.write,
            replacement: p.replacement,
            prefetch: p.prefetch,
            consistency: p.consistency,
            cooperative: p.cooperative,
        }
    }
}

impl fmt::Display for Choice {
    /// `write=… replacement=… prefetch=… consistency=… cooperative=…`,
    /// the arguments `parcache policy set` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write={} replacement={} prefetch={} consistency={} cooperative={}",
            self.write, self.replacement, self.prefetch, self.consistency, self.cooperative
        )
    }
}

impl Choice {
    /// The settings as (key, value) pairs.
    pub fn settings(&self) -> [(&'static str, String); 5] {
        [
            ("write", self.write.to_string()),
            ("replacement", self.replacement.to_string()),
            ("prefetch", self.prefetch.to_string()),
            ("consistency", self.consistency.to_string()),
            ("cooperative", self.cooperative.to_string()),
        ]
    }

    /// Sets one key from `key=value`, as `parcache policy set` would.
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("'{kv}' is not key=value (e.g. write=write-back)"))?;
        let e = |e: parcache_core::PolicyError| format!("{k}: {e}");
        match k.trim() {
            "write" => self.write = v.parse().map_err(e)?,
            "replacement" => self.replacement = v.parse().map_err(e)?,
            "prefetch" => self.prefetch = v.parse().map_err(e)?,
            "consistency" => {
                let c: ConsistencyKind = v.parse().map_err(e)?;
                if c.needs_cas() {
                    return Err(format!(
                        "consistency={c}: CAPFS plug-ins need the content-addressed store; replay models the block store"
                    ));
                }
                self.consistency = c
            }
            "cooperative" => self.cooperative = v.parse().map_err(e)?,
            other => {
                return Err(format!(
                    "'{other}' is not a policy replay varies (write, replacement, prefetch, consistency, cooperative)"
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_takes_policy_set_arguments_and_names_bad_ones() {
        let mut c = Choice::default();
        c.set("write=write-back").unwrap();
        c.set("cooperative=n-chance(n=2)").unwrap();
        assert_eq!(c.write, WritePolicyKind::WriteBack);
        assert!(c.to_string().contains("cooperative=n-chance(n=2)"), "{c}");
        assert!(c.set("write=sometimes").unwrap_err().starts_with("write:"));
        assert!(c.set("colour=red").unwrap_err().contains("colour"));
        assert!(c.set("consistency=seq-1").unwrap_err().contains("content-addressed"));
        assert!(c.set("write").is_err());
    }
}
