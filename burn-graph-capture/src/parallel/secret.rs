//! The job secret: what a group's processes share so that each can prove to the others
//! that it belongs to this job, over a network anyone may reach.
//!
//! It never leaves the process: not in a frame (only HMACs keyed by it travel), not in
//! `Debug`, errors, logs or a serialized config. Its bytes are wiped when it is dropped.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::error::{DistError, GroupMisuse};

/// The environment variable a group reads its secret from when its config gives none.
pub const SECRET_ENV: &str = "BURN_GRAPH_CAPTURE_SECRET";

/// The shortest secret taken: an HMAC over public nonces lets anyone who saw one
/// handshake guess a short secret offline.
pub const MIN_SECRET_BYTES: usize = 16;

/// A secret shared by every process of one data-parallel job
/// ([`DataParallelConfig::with_secret`](super::DataParallelConfig::with_secret), or the
/// `BURN_GRAPH_CAPTURE_SECRET` environment variable). Ranks prove they know it before
/// rank 0 lets them in, and rank 0 proves it too before a rank sends it anything.
///
/// Use at least 32 random bytes (`openssl rand -hex 32`), the same in every process.
#[derive(Clone)]
pub struct JobSecret(Arc<Zeroizing<Vec<u8>>>);

impl JobSecret {
    /// A secret of these bytes; at least [`MIN_SECRET_BYTES`] of them.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, DistError> {
        let bytes = Zeroizing::new(bytes.into());
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(DistError::InvalidUse(GroupMisuse::ShortSecret {
                len: bytes.len(),
                min: MIN_SECRET_BYTES,
            }));
        }
        Ok(Self(Arc::new(bytes)))
    }

    /// The secret in `BURN_GRAPH_CAPTURE_SECRET`, if it is set (and not empty).
    pub fn from_env() -> Result<Option<Self>, DistError> {
        match std::env::var_os(SECRET_ENV) {
            Some(value) if !value.is_empty() => Self::new(value.into_encoded_bytes()).map(Some),
            _ => Ok(None),
        }
    }

    /// The key the handshake's HMACs are keyed with.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq for JobSecret {
    fn eq(&self, other: &Self) -> bool {
        self.bytes().ct_eq(other.bytes()).into()
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

/// A rendezvous on any address that is not loopback can be reached by other machines:
/// it needs a secret. Loopback is reachable only from this machine's processes.
pub(crate) fn check_needed(
    addresses: &[SocketAddr],
    secret: Option<&JobSecret>,
) -> Result<(), DistError> {
    match addresses.iter().find(|address| !address.ip().is_loopback()) {
        Some(address) if secret.is_none() => {
            Err(DistError::InvalidUse(GroupMisuse::SecretNeeded {
                address: address.to_string(),
            }))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_shows_as_redacted_and_short_ones_are_refused() {
        let secret = JobSecret::new("a job secret of enough bytes").unwrap();
        assert_eq!(format!("{secret:?}"), "JobSecret(<redacted>)");
        assert_eq!(
            secret,
            JobSecret::new("a job secret of enough bytes").unwrap()
        );
        assert_ne!(
            secret,
            JobSecret::new("another secret, long enough").unwrap()
        );
        assert_eq!(
            JobSecret::new("short").unwrap_err(),
            DistError::InvalidUse(GroupMisuse::ShortSecret { len: 5, min: 16 })
        );
    }

    #[test]
    fn only_loopback_goes_without_a_secret() {
        let any: SocketAddr = "0.0.0.0:29500".parse().unwrap();
        let lan: SocketAddr = "10.1.2.3:29500".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:29500".parse().unwrap();
        let local6: SocketAddr = "[::1]:29500".parse().unwrap();
        assert_eq!(check_needed(&[local, local6], None), Ok(()));
        for address in [any, lan] {
            assert_eq!(
                check_needed(&[local, address], None),
                Err(DistError::InvalidUse(GroupMisuse::SecretNeeded {
                    address: address.to_string()
                }))
            );
            let secret = JobSecret::new([7u8; 32]).unwrap();
            assert_eq!(check_needed(&[address], Some(&secret)), Ok(()));
        }
    }
}
