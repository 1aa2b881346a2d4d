//! The simulator's driver of a core cache (DESIGN.md §1: the simulator and
//! the daemons are the two drivers of the same state machines): it carries
//! out a [`Cache`]'s effects against whatever a model puts below it (the
//! 1992 model's disks; other nodes' caches and a server's disk in a
//! cooperative model), and keeps the cache's one timer. Every model that
//! simulates a cache uses it, so none has an executor of its own.

use parcache_core::{BlockKey, Cache, Effect, IoToken, ProcId, Time, WriteCause};

/// What a model puts below a cache: where its writes and fetches go, how a
/// held process goes on, how the cache's timer is set.
pub trait Below {
    /// Write the block down (`whole`: the cache holds every byte of it;
    /// `detached`: from an auxiliary buffer, nobody waits; `cause`: why);
    /// call [`Cache::write_done`] with `token` when done.
    fn write(&mut self, now: Time, token: IoToken, key: BlockKey, whole: bool, detached: bool, cause: WriteCause);
    /// Fetch the block; call [`Cache::fetch_done`] with `token` when done.
    /// Returns `false` if there is nothing to fetch (the block was never
    /// written): the driver then completes the fetch at once.
    fn fetch(&mut self, now: Time, token: IoToken, key: BlockKey, prefetch: bool) -> bool;
    /// A process the cache held may try again.
    fn resume(&mut self, now: Time, proc: ProcId);
    /// Raise a timer event at `at` and pass it to [`CacheDriver::timer`].
    fn wake_at(&mut self, at: Time);
    /// The clean block `key` left the cache (only if the cache reports
    /// evictions): a cooperative model forwards it here.
    fn evicted(&mut self, _now: Time, _key: BlockKey) {}
}

/// A cache and its pending timer.
pub struct CacheDriver {
    cache: Cache,
    timer_at: Option<Time>,
}

impl CacheDriver {
    pub fn new(cache: Cache) -> CacheDriver {
        CacheDriver { cache, timer_at: None }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The cache, to begin and end accesses and report completions; call
    /// [`CacheDriver::drain`] after.
    pub fn cache_mut(&mut self) -> &mut Cache {
        &mut self.cache
    }

    /// Carries out every effect the cache has queued, and asks for a timer
    /// event if the cache's next deadline is earlier than the one asked for.
    pub fn drain(&mut self, now: Time, below: &mut impl Below) {
        while let Some(e) = self.cache.poll_effect() {
            match e {
                Effect::Write {
                    token,
                    key,
                    whole,
                    detached,
                    cause,
                    ..
                } => below.write(now, token, key, whole, detached, cause),
                Effect::Fetch {
                    token, key, prefetch, ..
                } => {
                    if !below.fetch(now, token, key, prefetch) {
                        self.cache.fetch_done(now, token);
                    }
                }
                Effect::Resume { proc } => below.resume(now, proc),
                Effect::Evicted { key, .. } => below.evicted(now, key),
            }
        }
        if let Some(t) = self.cache.poll_timeout() {
            let t = t.max(now);
            if self.timer_at.is_none_or(|at| t < at) {
                self.timer_at = Some(t);
                below.wake_at(t);
            }
        }
    }

    /// A timer event at `now`: the cache's deadline passes if it is the
    /// event last asked for (earlier ones were superseded).
    pub fn timer(&mut self, now: Time, below: &mut impl Below) {
        if self.timer_at == Some(now) {
            self.timer_at = None;
            self.cache.handle_timeout(now);
            self.drain(now, below);
        }
    }
}
