//! The error behind a typed error, kept whole where this process made it and as its
//! text where it crossed a report or another rank: typed errors stay `Clone`,
//! serializable and comparable while `source()` still reaches the original.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// An error kept as the `#[source]` of one of this crate's errors. Reach the original
/// with [`Cause::downcast_ref`] (e.g. the CUDA runtime's `CaptureError` and its driver
/// error, or an `std::io::Error`); a deserialized cause has only its text.
#[derive(Clone)]
pub struct Cause {
    text: String,
    error: Option<Arc<dyn Error + Send + Sync>>,
}

impl Cause {
    /// Keeps `error` as the cause.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Self {
            text: error.to_string(),
            error: Some(Arc::new(error)),
        }
    }

    /// The original error as `E`, if that is its type and this process made it.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.error.as_deref()?.downcast_ref()
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Some(error) => fmt::Debug::fmt(error, f),
            None => f.debug_tuple("Cause").field(&self.text).finish(),
        }
    }
}

/// The cause reads as the original error, so its source is the original's source.
impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.as_deref()?.source()
    }
}

/// Causes are equal when they read the same (a report's cause has only its text).
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Cause {}

impl Serialize for Cause {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Cause {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self {
            text: String::deserialize(deserializer)?,
            error: None,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An error with no source, for tests of errors that keep a cause.
    #[derive(Debug, thiserror::Error)]
    #[error("inner failure")]
    pub(crate) struct Inner;

    /// An error whose source is [`Inner`].
    #[derive(Debug, thiserror::Error)]
    #[error("outer failure")]
    pub(crate) struct Outer(#[source] pub(crate) Inner);

    #[test]
    fn a_cause_reads_as_its_error_and_keeps_its_chain() {
        let cause = Cause::new(Outer(Inner));
        assert_eq!(cause.to_string(), "outer failure");
        assert_eq!(
            cause.source().map(|s| s.to_string()).as_deref(),
            Some("inner failure")
        );
        assert!(cause.downcast_ref::<Outer>().is_some());
        assert!(cause.downcast_ref::<Inner>().is_none());
    }

    #[test]
    fn a_deserialized_cause_keeps_only_its_text() {
        let cause = Cause::new(Inner);
        let back: Cause = serde_json::from_str(&serde_json::to_string(&cause).unwrap()).unwrap();
        assert_eq!(back, cause);
        assert_eq!(back.to_string(), "inner failure");
        assert!(
            back.downcast_ref::<Inner>().is_none(),
            "only the text travels"
        );
        assert!(back.source().is_none());
    }
}
