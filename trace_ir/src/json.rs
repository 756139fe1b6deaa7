//! Versioned JSON (de)serialization of traces, for dumps and fuzz corpora.
//! Loading treats the text as untrusted: anything malformed or inconsistent is
//! an [`Error::InvalidTrace`], never a panic.

use serde::{Deserialize, Serialize};

use crate::{Error, Result, Trace};

/// The format version written by this build. Loading accepts this version only.
pub const TRACE_FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct TraceFile {
    format: String,
    version: u32,
    trace: Trace,
}

const FORMAT_NAME: &str = "deferfuse-trace";

impl Trace {
    pub fn to_json(&self) -> String {
        let file = TraceFile {
            format: FORMAT_NAME.into(),
            version: TRACE_FORMAT_VERSION,
            trace: self.clone(),
        };
        serde_json::to_string_pretty(&file).expect("a trace always serializes")
    }

    pub fn from_json(text: &str) -> Result<Trace> {
        #[derive(Deserialize)]
        struct Header {
            format: String,
            version: u32,
        }
        let header: Header = serde_json::from_str(text)
            .map_err(|e| Error::InvalidTrace(format!("not a trace file: {e}")))?;
        if header.format != FORMAT_NAME {
            return Err(Error::InvalidTrace(format!(
                "format is {:?}, expected {FORMAT_NAME:?}",
                header.format
            )));
        }
        if header.version != TRACE_FORMAT_VERSION {
            return Err(Error::InvalidTrace(format!(
                "format version {} is not supported (this build reads version {TRACE_FORMAT_VERSION})",
                header.version
            )));
        }
        let file: TraceFile =
            serde_json::from_str(text).map_err(|e| Error::InvalidTrace(e.to_string()))?;
        file.trace.validate()?;
        Ok(file.trace)
    }
}
