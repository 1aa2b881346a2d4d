//! The 2005 CAPFS model (Vilayannur et al. 2005): a cluster of clients, a
//! hash server and content-addressed data servers running the core's CAPFS
//! recipes, commits and H-cache ([`model`]); the scenarios that reproduce
//! §4's shapes are in `scenario::capfs05`.

pub mod model;
