//! Cluster-secret authentication (DESIGN.md §2, Security).
//!
//! Every connection starts with a mutual challenge–response. Each side sends
//! a fresh random nonce; each proves knowledge of the 32-byte cluster secret
//! by sending a blake3 keyed hash of both nonces under a role label. The
//! secret never crosses the wire, a recorded exchange cannot be replayed
//! (new nonces every time), and the client checks the server too. Proofs are
//! compared in constant time (`blake3::Hash`'s equality).

use crate::frame::{read_frame, write_frame, FrameError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};

/// Protocol version spoken by this build.
pub const VERSION: u16 = 1;
/// How long a peer has to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The cluster secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

#[derive(Debug, Error)]
pub enum AuthError {
    #[error("peer failed to prove the cluster secret")]
    BadProof,
    #[error("peer refused us: {0}")]
    Refused(String),
    #[error("peer speaks protocol version {0}, we speak {VERSION}")]
    Version(u16),
    #[error("handshake did not finish within {0:?}")]
    Timeout(Duration),
    #[error("unexpected handshake message")]
    Unexpected,
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("secret file {path}: {reason}")]
    SecretFile { path: String, reason: String },
}

/// A random number from the OS (a client's id: [`crate::Request::Once`]).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source works");
    u64::from_le_bytes(b)
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Secret {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).expect("the OS random source works");
        Secret(b)
    }

    pub fn from_bytes(b: [u8; 32]) -> Secret {
        Secret(b)
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Secret> {
        let v = hex::decode(s.trim()).ok()?;
        Some(Secret(v.try_into().ok()?))
    }

    /// Reads a secret file (64 hex digits).
    pub fn load(path: &Path) -> Result<Secret, AuthError> {
        let err = |reason: String| AuthError::SecretFile {
            path: path.display().to_string(),
            reason,
        };
        let s = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Secret::from_hex(&s).ok_or_else(|| err("not 64 hexadecimal digits".into()))
    }

    /// Writes the secret readable by its owner only.
    pub fn save(&self, path: &Path) -> Result<(), AuthError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |e: std::io::Error| AuthError::SecretFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        writeln!(f, "{}", self.to_hex()).map_err(err)?;
        f.sync_all().map_err(err)
    }

    fn proof(&self, label: &[u8], a: &[u8; 32], b: &[u8; 32]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(label);
        h.update(a);
        h.update(b);
        h.finalize()
    }
}

#[derive(Serialize, Deserialize, Debug)]
enum Handshake {
    Hello { version: u16, nonce: [u8; 32] },
    Challenge { nonce: [u8; 32], proof: [u8; 32] },
    Proof { proof: [u8; 32] },
    Welcome,
    Refused { reason: String },
}

fn nonce() -> [u8; 32] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random source works");
    b
}

async fn timed<T>(f: impl std::future::Future<Output = Result<T, AuthError>>) -> Result<T, AuthError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, f)
        .await
        .map_err(|_| AuthError::Timeout(HANDSHAKE_TIMEOUT))?
}

/// Client side: proves the secret and checks the server's proof.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, secret: &Secret) -> Result<(), AuthError> {
    timed(async {
        let mine = nonce();
        write_frame(
            s,
            0,
            &Handshake::Hello {
                version: VERSION,
                nonce: mine,
            },
            &[],
        )
        .await?;
        let theirs = match read_frame::<Handshake, _>(s).await?.msg {
            Handshake::Challenge { nonce, proof } => {
                if secret.proof(b"parcache server", &mine, &nonce) != blake3::Hash::from_bytes(proof) {
                    // Say so, so the server can log who failed and why.
                    let reason = "the client's cluster secret does not match this server's".to_string();
                    let _ = write_frame(s, 0, &Handshake::Refused { reason }, &[]).await;
                    return Err(AuthError::BadProof);
                }
                nonce
            }
            Handshake::Refused { reason } => return Err(AuthError::Refused(reason)),
            _ => return Err(AuthError::Unexpected),
        };
        let proof = *secret.proof(b"parcache client", &theirs, &mine).as_bytes();
        write_frame(s, 0, &Handshake::Proof { proof }, &[]).await?;
        match read_frame::<Handshake, _>(s).await?.msg {
            Handshake::Welcome => Ok(()),
            Handshake::Refused { reason } => Err(AuthError::Refused(reason)),
            _ => Err(AuthError::Unexpected),
        }
    })
    .await
}

/// Server side: checks the client's proof and proves the secret in turn.
/// On failure the peer is told why (without detail that helps an attacker).
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, secret: &Secret) -> Result<(), AuthError> {
    timed(async {
        let theirs = match read_frame::<Handshake, _>(s).await?.msg {
            Handshake::Hello { version, nonce } if version == VERSION => nonce,
            Handshake::Hello { version, .. } => {
                let reason = format!("protocol version {version} not supported (server speaks {VERSION})");
                write_frame(s, 0, &Handshake::Refused { reason }, &[]).await?;
                return Err(AuthError::Version(version));
            }
            _ => return Err(AuthError::Unexpected),
        };
        let mine = nonce();
        let proof = *secret.proof(b"parcache server", &theirs, &mine).as_bytes();
        write_frame(s, 0, &Handshake::Challenge { nonce: mine, proof }, &[]).await?;
        match read_frame::<Handshake, _>(s).await?.msg {
            Handshake::Proof { proof }
                if secret.proof(b"parcache client", &mine, &theirs) == blake3::Hash::from_bytes(proof) =>
            {
                write_frame(s, 0, &Handshake::Welcome, &[]).await?;
                Ok(())
            }
            Handshake::Refused { reason } => Err(AuthError::Refused(reason)),
            Handshake::Proof { .. } => {
                write_frame(
                    s,
                    0,
                    &Handshake::Refused {
                        reason: "authentication failed".into(),
                    },
                    &[],
                )
                .await?;
                Err(AuthError::BadProof)
            }
            _ => Err(AuthError::Unexpected),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn same_secret_passes_both_ways() {
        let s = Secret::generate();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let s2 = s.clone();
        let server = tokio::spawn(async move { server_handshake(&mut b, &s2).await });
        client_handshake(&mut a, &s).await.unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_by_both_sides() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move { server_handshake(&mut b, &Secret::generate()).await });
        // The client notices first: the server's proof does not match.
        assert!(matches!(
            client_handshake(&mut a, &Secret::generate()).await,
            Err(AuthError::BadProof)
        ));
        drop(a);
        assert!(server.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_client_that_skips_the_check_is_still_refused() {
        // A client that ignores the server's proof and sends garbage.
        let (mut a, mut b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move { server_handshake(&mut b, &Secret::generate()).await });
        write_frame(
            &mut a,
            0,
            &Handshake::Hello {
                version: VERSION,
                nonce: [1; 32],
            },
            &[],
        )
        .await
        .unwrap();
        let _challenge: crate::frame::Frame<Handshake> = read_frame(&mut a).await.unwrap();
        write_frame(&mut a, 0, &Handshake::Proof { proof: [0; 32] }, &[])
            .await
            .unwrap();
        assert!(matches!(
            read_frame::<Handshake, _>(&mut a).await.unwrap().msg,
            Handshake::Refused { .. }
        ));
        assert!(matches!(server.await.unwrap(), Err(AuthError::BadProof)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out() {
        let (_a, mut b) = tokio::io::duplex(4096);
        let r = server_handshake(&mut b, &Secret::generate()).await;
        assert!(matches!(r, Err(AuthError::Timeout(_))));
    }

    #[test]
    fn secret_files_round_trip_and_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("parcache-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("secret");
        let s = Secret::generate();
        s.save(&p).unwrap();
        assert_eq!(Secret::load(&p).unwrap(), s);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&p, "nope").unwrap();
        assert!(Secret::load(&p).unwrap_err().to_string().contains("64 hexadecimal"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
