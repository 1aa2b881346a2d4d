//! The policy catalogue by name (DESIGN.md §3): the keys a file or
//! directory can carry, their values checked and written in one canonical
//! form, and a file's policies read from its settings. Every part of
//! parcache (metadata server, node client, command line) parses policy
//! names here and nowhere else.

use crate::consistency::ConsistencyKind;
use crate::cooperative::CooperativeKind;
use crate::error::PolicyError;
use crate::prefetch::PrefetchKind;
use crate::replacement::ReplacementKind;
use crate::write::WritePolicyKind;

/// What files sharing a pool of the node cache have in common.
pub type PoolKey = (ReplacementKind, WritePolicyKind, PrefetchKind, CooperativeKind, bool);

/// The policy keys a file or directory can carry.
pub const POLICY_KEYS: [&str; 11] = [
    "write",
    "replacement",
    "prefetch",
    "consistency",
    "cooperative",
    "store",
    "bypass",
    "nv",
    "page-cache",
    "stripe_unit",
    "stripe_width",
];

/// How a file's bytes are kept on the data servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// Striped blocks, overwritten in place (PVFS-like; the default).
    #[default]
    Blocks,
    /// Content-addressed chunks of `chunk` bytes named by their blake3
    /// hash, and a recipe of hashes at the metadata server (CAPFS 2005
    /// §3.3): identical chunks are stored once, and writes commit
    /// atomically.
    Cas { chunk: u32 },
}

impl StoreKind {
    /// CAPFS's default chunk: 16 KiB (2005 §3.3).
    pub const CAS_DEFAULT: StoreKind = StoreKind::Cas { chunk: 16 << 10 };
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            StoreKind::Blocks => f.write_str("blocks"),
            StoreKind::Cas { chunk } if chunk == 16 << 10 => f.write_str("cas"),
            StoreKind::Cas { chunk } => write!(f, "cas(chunk={chunk})"),
        }
    }
}

impl std::str::FromStr for StoreKind {
    type Err = PolicyError;
    /// `blocks`, `cas`, `cas(chunk=64K)` (4K to 1M).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, params) = split_params(s)?;
        let mut kind = find_named(
            &[StoreKind::Blocks, StoreKind::CAS_DEFAULT],
            name,
            "store",
            |k| match k {
                StoreKind::Blocks => "blocks",
                StoreKind::Cas { .. } => "cas",
            },
        )?;
        for (k, v) in params {
            match (&mut kind, k) {
                (StoreKind::Cas { chunk }, "chunk") => {
                    *chunk = parse_size(v)
                        .filter(|n| (4 << 10..=1 << 20).contains(n))
                        .ok_or_else(|| PolicyError::BadParameter {
                            policy: name.to_string(),
                            detail: format!("chunk '{v}' must be a size from 4K to 1M"),
                        })? as u32
                }
                _ => {
                    return Err(PolicyError::BadParameter {
                        policy: name.to_string(),
                        detail: format!("unknown parameter '{k}'"),
                    })
                }
            }
        }
        Ok(kind)
    }
}

/// Checks a setting and returns its value in canonical form (what the
/// metadata server stores and `policy get` shows).
pub fn check_setting(key: &str, value: &str) -> Result<String, PolicyError> {
    let bad = |detail: String| PolicyError::BadParameter {
        policy: key.to_string(),
        detail,
    };
    Ok(match key {
        "write" => value.parse::<WritePolicyKind>()?.to_string(),
        "replacement" => value.parse::<ReplacementKind>()?.to_string(),
        "prefetch" => value.parse::<PrefetchKind>()?.to_string(),
        "consistency" => value.parse::<ConsistencyKind>()?.to_string(),
        "cooperative" => value.parse::<CooperativeKind>()?.to_string(),
        "store" => value.parse::<StoreKind>()?.to_string(),
        "bypass" => value.parse::<crate::bypass::hints::HintList>()?.to_string(),
        "page-cache" => value.parse::<crate::page_cache::PageCache>()?.to_string(),
        "nv" => match parse_on_off(value) {
            Some(true) => "on".to_string(),
            Some(false) => "off".to_string(),
            None => return Err(bad(format!("'{value}' must be on or off"))),
        },
        "stripe_unit" => parse_size(value)
            .filter(|n| (512..=16 << 20).contains(n))
            .ok_or_else(|| bad(format!("'{value}' must be a size from 512 to 16M (e.g. 64K)")))?
            .to_string(),
        "stripe_width" => value
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(format!("'{value}' must be a positive number of servers")))?
            .to_string(),
        _ => {
            return Err(PolicyError::UnknownKey {
                key: key.to_string(),
                known: POLICY_KEYS.join(", "),
            })
        }
    })
}

/// `on`/`off` (and `true`/`false`, `yes`/`no`, `1`/`0`).
pub fn parse_on_off(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// Parses `65536`, `64K`, `1M`, `2G`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (n, m) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.trim().parse::<u64>().ok()?.checked_mul(m)
}

/// Bytes per stripe unit of a new file whose policies set none.
pub const DEFAULT_STRIPE_UNIT: u64 = 64 << 10;

/// A new file's stripe unit and width under its policy `settings`, with
/// `servers` data servers: what the metadata server gives a file it makes,
/// and what a node gives one it makes behind (`dir_hold`), so the two
/// agree.
pub fn stripe(settings: &[(String, String)], servers: u32) -> (u64, u32) {
    let policy = |k: &str| settings.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let unit = policy("stripe_unit")
        .and_then(parse_size)
        .unwrap_or(DEFAULT_STRIPE_UNIT);
    let width = policy("stripe_width")
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(servers)
        .clamp(1, servers.max(1));
    (unit, width)
}

/// A policy's name and its `key=value` parameters.
pub type Named<'a> = (&'a str, Vec<(&'a str, &'a str)>);

/// Splits `name(k=v, k2=v2)` into the name and its parameters.
pub fn split_params(s: &str) -> Result<Named<'_>, PolicyError> {
    let s = s.trim();
    let (name, params) = match s.find('(') {
        Some(i) if s.ends_with(')') => (s[..i].trim(), &s[i + 1..s.len() - 1]),
        Some(_) => {
            return Err(PolicyError::BadParameter {
                policy: s.to_string(),
                detail: "missing ')'".into(),
            })
        }
        None => (s, ""),
    };
    let mut out = Vec::new();
    for kv in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or_else(|| PolicyError::BadParameter {
            policy: name.to_string(),
            detail: format!("'{kv}' is not key=value"),
        })?;
        out.push((k.trim(), v.trim()));
    }
    Ok((name, out))
}

/// The policy of `all` called `name` (the bare name, without parameters),
/// or an error naming `what` and every known name.
pub fn find_named<K: Copy>(
    all: &[K],
    name: &str,
    what: &'static str,
    name_of: impl Fn(K) -> &'static str,
) -> Result<K, PolicyError> {
    all.iter()
        .copied()
        .find(|&k| name_of(k) == name)
        .ok_or_else(|| PolicyError::Unknown {
            what,
            name: name.to_string(),
            known: all.iter().map(|&k| name_of(k)).collect::<Vec<_>>().join(", "),
        })
}

/// The policies a node applies to one file: its settings at the metadata
/// server, with defaults for those not set.
///
/// Defaults (docs/client.md says why): `write-full` (a block goes to the
/// data servers as soon as it is completely written, so streaming writes
/// leave the node at once and little dirty data waits; Kotz & Ellis 1992
/// found it the best write policy for parallel writers), `lru`,
/// `read-ahead` prefetch (one-block-ahead for sequential readers, with a
/// growing window; nothing for random ones), and `close-to-open`
/// consistency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FilePolicies {
    pub write: WritePolicyKind,
    pub replacement: ReplacementKind,
    pub prefetch: PrefetchKind,
    pub consistency: ConsistencyKind,
    pub cooperative: CooperativeKind,
    pub store: StoreKind,
    /// `nv=on`: writes are acknowledged once in the node's durable write
    /// cache (`--nv-dir`), the client NV cache of Biswas et al. 1993 §2.2;
    /// a node without one writes such files through.
    pub nv: bool,
    /// Whether the kernel above a mount keeps the file's pages
    /// ([`crate::page_cache`]); not a cache policy of the simulator's.
    pub page_cache: crate::page_cache::PageCache,
}

impl FilePolicies {
    /// Whether a small file under these policies (and `settings`, the
    /// file's own) may keep its only copy on the metadata server (data on
    /// metadata, as Lustre's DoM): plain blocks under `close-to-open`,
    /// with no cooperative tier, NV cache or bypass hints, whose every
    /// path to the data servers is the node's data path, which writes
    /// such a file out before it touches its parts there.
    pub fn may_live_on_metadata(&self, settings: &[(String, String)]) -> bool {
        self.store == StoreKind::Blocks
            && self.consistency == ConsistencyKind::CloseToOpen
            && self.cooperative == CooperativeKind::None
            && !self.nv
            && settings.iter().all(|(k, _)| k != "bypass")
    }
}

impl Default for FilePolicies {
    fn default() -> Self {
        FilePolicies {
            write: WritePolicyKind::WriteFull,
            replacement: ReplacementKind::Lru,
            prefetch: PrefetchKind::ReadAhead,
            consistency: ConsistencyKind::CloseToOpen,
            cooperative: CooperativeKind::None,
            store: StoreKind::Blocks,
            nv: false,
            page_cache: crate::page_cache::PageCache::Auto,
        }
    }
}

impl FilePolicies {
    /// Reads settings the metadata server holds (checked by
    /// [`check_setting`] when set); layout keys are not the cache's
    /// business.
    pub fn from_settings(settings: &[(String, String)]) -> Self {
        let mut p = FilePolicies::default();
        for (k, v) in settings {
            match k.as_str() {
                "write" => p.write = v.parse().unwrap_or(p.write),
                "replacement" => p.replacement = v.parse().unwrap_or(p.replacement),
                "prefetch" => p.prefetch = v.parse().unwrap_or(p.prefetch),
                "consistency" => p.consistency = v.parse().unwrap_or(p.consistency),
                "cooperative" => p.cooperative = v.parse().unwrap_or(p.cooperative),
                "store" => p.store = v.parse().unwrap_or(p.store),
                "nv" => p.nv = parse_on_off(v).unwrap_or(p.nv),
                "page-cache" => p.page_cache = v.parse().unwrap_or(p.page_cache),
                _ => {}
            }
        }
        // A content-addressed file's consistency is a CAPFS plug-in;
        // sequential consistency with a coherent H-cache when none is set.
        if matches!(p.store, StoreKind::Cas { .. }) && !p.consistency.needs_cas() {
            p.consistency = ConsistencyKind::Capfs(crate::consistency::seq_2::PARAMS);
        }
        p
    }

    /// The cache's policies as settings (key, value), as `policy set`
    /// takes them (the simulator's choices: `page-cache` is not one).
    pub fn settings(&self) -> [(&'static str, String); 7] {
        [
            ("write", self.write.to_string()),
            ("replacement", self.replacement.to_string()),
            ("prefetch", self.prefetch.to_string()),
            ("consistency", self.consistency.to_string()),
            ("cooperative", self.cooperative.to_string()),
            ("store", self.store.to_string()),
            ("nv", if self.nv { "on" } else { "off" }.to_string()),
        ]
    }

    /// Every setting (key, value) this node applies: [`Self::settings`] and
    /// `page-cache`.
    pub fn node_settings(&self) -> Vec<(&'static str, String)> {
        let mut all = self.settings().to_vec();
        all.push(("page-cache", self.page_cache.to_string()));
        all
    }

    /// Files with the same replacement, write, prefetch and cooperative
    /// policies and the same `nv` share a pool of the node cache.
    pub fn pool_key(&self) -> PoolKey {
        (self.replacement, self.write, self.prefetch, self.cooperative, self.nv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_override_defaults_and_layout_keys_are_ignored() {
        let s = |k: &str, v: &str| (k.to_string(), v.to_string());
        let p = FilePolicies::from_settings(&[
            s("write", "write-back"),
            s("stripe_unit", "1M"),
            s("consistency", "none"),
        ]);
        assert_eq!(p.write, WritePolicyKind::WriteBack);
        assert_eq!(p.replacement, ReplacementKind::Lru);
        assert_eq!(p.consistency, ConsistencyKind::None);
        assert_eq!(FilePolicies::from_settings(&[]), FilePolicies::default());
    }

    #[test]
    fn settings_are_checked_and_made_canonical() {
        assert_eq!(check_setting("consistency", " nfs(timeout=3s) ").unwrap(), "nfs");
        assert_eq!(check_setting("stripe_unit", "64K").unwrap(), "65536");
        let e = check_setting("colour", "red").unwrap_err().to_string();
        assert!(e.contains("colour") && e.contains("stripe_width"), "{e}");
        let e = check_setting("stripe_unit", "1T").unwrap_err().to_string();
        assert!(e.contains("stripe_unit") && e.contains("512"), "{e}");
        assert!(check_setting("write", "threshold(high=1").is_err());
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(check_setting("store", "cas(chunk=64K)").unwrap(), "cas(chunk=65536)");
        assert_eq!(check_setting("store", "cas(chunk=16K)").unwrap(), "cas");
        assert!(check_setting("store", "cas(chunk=3)").is_err());
        assert_eq!(check_setting("nv", "ON").unwrap(), "on");
        assert_eq!(check_setting("nv", "0").unwrap(), "off");
        let e = check_setting("nv", "maybe").unwrap_err().to_string();
        assert!(e.contains("nv") && e.contains("on or off"), "{e}");
        assert!(FilePolicies::from_settings(&[("nv".to_string(), "on".to_string())]).nv);
        assert_eq!(check_setting("page-cache", "BYPASS").unwrap(), "bypass");
        let e = check_setting("page-cache", "off").unwrap_err().to_string();
        assert!(e.contains("page-cache") && e.contains("auto, bypass or cached"), "{e}");
        let p = FilePolicies::from_settings(&[("page-cache".to_string(), "bypass".to_string())]);
        assert_eq!(p.page_cache, crate::page_cache::PageCache::Bypass);
        assert!(p.node_settings().contains(&("page-cache", "bypass".to_string())));
        assert!(check_setting("store", "tape")
            .unwrap_err()
            .to_string()
            .contains("blocks"));
    }
}
