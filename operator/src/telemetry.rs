//! Logging set-up shared by every role.

use crate::cli::{LogArgs, LogFormat};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. A bad filter falls back to `info` with a warning rather than
/// refusing to start: logging must never be the reason a proxy is down.
pub fn init(args: &LogArgs) {
    let (filter, bad_filter) = match EnvFilter::try_new(&args.filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if result.is_ok()
        && let Some(e) = bad_filter
    {
        tracing::warn!(filter = %args.filter, error = %e, "invalid log filter; using info");
    }
}
