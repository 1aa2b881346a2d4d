//! Time as the core sees it: a plain count of nanoseconds handed in by the
//! driver. The core never reads a clock (DESIGN.md §1); the simulator passes
//! virtual time, the daemons pass time since their start.

use std::fmt;
use std::ops::{Add, Sub};

/// A point in time, in nanoseconds since an origin the driver chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Time(pub u64);

/// A length of time in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Span(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// `self - earlier`, or zero if `earlier` is later.
    pub fn since(self, earlier: Time) -> Span {
        Span(self.0.saturating_sub(earlier.0))
    }
}

impl Span {
    pub const ZERO: Span = Span(0);
    pub fn from_secs(s: u64) -> Span {
        Span(s * 1_000_000_000)
    }
    pub fn from_millis(ms: u64) -> Span {
        Span(ms * 1_000_000)
    }
    /// From fractional milliseconds, rounded to the nearest nanosecond.
    pub fn from_millis_f64(ms: f64) -> Span {
        Span((ms * 1e6).round().max(0.0) as u64)
    }
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl Add<Span> for Time {
    type Output = Time;
    fn add(self, d: Span) -> Time {
        Time(self.0 + d.0)
    }
}

impl Sub<Span> for Time {
    type Output = Time;
    fn sub(self, d: Span) -> Time {
        Time(self.0.saturating_sub(d.0))
    }
}

/// A span repeated `n` times (a per-item cost times the items).
impl std::ops::Mul<u64> for Span {
    type Output = Span;
    fn mul(self, n: u64) -> Span {
        Span(self.0.saturating_mul(n))
    }
}

impl Add for Span {
    type Output = Span;
    fn add(self, d: Span) -> Span {
        Span(self.0 + d.0)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0;
        if ns == 0 {
            write!(f, "0s")
        } else if ns.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", ns / 1_000_000_000)
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{}ns", ns)
        }
    }
}

/// Parses `30s`, `250ms`, `100us`, `5ns`, `2m` (minutes) or a bare number of seconds.
pub fn parse_span(s: &str) -> Option<Span> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e9)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e9)
    } else {
        (s, 1e9)
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Some(Span((v * mult).round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_parse_and_print_round_trip() {
        for s in ["30s", "250ms", "100us", "7ns", "0s"] {
            assert_eq!(parse_span(s).unwrap().to_string(), s);
        }
        assert_eq!(parse_span("2m"), Some(Span::from_secs(120)));
        assert_eq!(parse_span("1.5"), Some(Span::from_millis(1500)));
        assert_eq!(parse_span("-1s"), None);
        assert_eq!(parse_span("soon"), None);
    }
}
