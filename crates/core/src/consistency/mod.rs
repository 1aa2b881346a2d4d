//! Consistency between nodes (DESIGN.md §3, "Consistency"): what a node
//! does at open and close so that other nodes see its writes.
//!
//! Three plug-ins:
//! * `close-to-open` (the default): close pushes the file's dirty blocks and
//!   reports its size; open drops cached blocks of a file whose version
//!   moved since they were cached.
//! * `sprite` (Nelson, Welch & Ousterhout, as Biswas et al. 1993 §2 use
//!   it): opens and closes go to the metadata server, which recalls the last
//!   writer's dirty blocks and disables caching of write-shared files
//!   ([`sprite`]); close pushes nothing (delayed write-back).
//! * `none` (PVFS): no guarantee, no traffic; dirty blocks go down when the
//!   write policy says.

pub mod close_to_open;
pub mod sprite;

use crate::error::PolicyError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConsistencyKind {
    #[default]
    CloseToOpen,
    Sprite,
    None,
}

impl ConsistencyKind {
    pub const ALL: [ConsistencyKind; 3] = [
        ConsistencyKind::CloseToOpen,
        ConsistencyKind::Sprite,
        ConsistencyKind::None,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ConsistencyKind::CloseToOpen => "close-to-open",
            ConsistencyKind::Sprite => "sprite",
            ConsistencyKind::None => "none",
        }
    }

    /// Whether close pushes the file's dirty blocks down.
    pub fn flush_on_close(self) -> bool {
        self == ConsistencyKind::CloseToOpen
    }

    /// Whether open revalidates cached blocks against the file's version.
    pub fn revalidate_on_open(self) -> bool {
        self != ConsistencyKind::None
    }

    /// Whether opens and closes are registered at the metadata server
    /// (which may then call the node back).
    pub fn opens_at_server(self) -> bool {
        self == ConsistencyKind::Sprite
    }
}

impl fmt::Display for ConsistencyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ConsistencyKind {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ConsistencyKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| PolicyError::Unknown {
                what: "consistency",
                name: s.to_string(),
                known: ConsistencyKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for k in ConsistencyKind::ALL {
            assert_eq!(k.name().parse::<ConsistencyKind>().unwrap(), k);
        }
        let e = "sprite2".parse::<ConsistencyKind>().unwrap_err().to_string();
        assert!(e.contains("close-to-open"), "{e}");
    }
}
