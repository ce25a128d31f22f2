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
    let filter = quiet_rustls(filter, &args.filter);
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

/// rustls warns about each peer's protocol mistakes (an IP address sent as SNI, say): a line
/// per connection that any client controls. Those handshakes are counted and logged at debug
/// by the proxy itself, so rustls speaks only of errors unless the filter names it.
fn quiet_rustls(filter: EnvFilter, text: &str) -> EnvFilter {
    if text.contains("rustls") {
        return filter;
    }
    match "rustls=error".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_warnings_are_off_unless_asked_for() {
        let quiet = quiet_rustls(EnvFilter::new("info"), "info").to_string();
        assert!(quiet.contains("rustls=error"), "{quiet}");
        let asked =
            quiet_rustls(EnvFilter::new("info,rustls=warn"), "info,rustls=warn").to_string();
        assert!(
            asked.contains("rustls=warn") && !asked.contains("rustls=error"),
            "{asked}"
        );
    }
}
