//! The 1996 PACA model (Cortes, Girona & Labarta 1996 §6–7): 50 nodes whose
//! caches form one cooperative cache, one disk on the file server's node,
//! and the paper's communication costs; the placement and forwarding
//! decisions come from `parcache_core::cooperative`. [`trace`] reads the
//! Sprite-derived block trace the scenarios replay.

pub mod model;
pub mod trace;
pub mod workload;
