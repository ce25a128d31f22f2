//! Flow-control windows (RFC 9113 section 6.9): one for the connection and one per stream,
//! in each direction.

use super::ErrorCode;

/// Every window's size until SETTINGS or WINDOW_UPDATE change it.
pub const DEFAULT_WINDOW: u32 = 65_535;

/// The largest a window may be.
const MAX_WINDOW: i64 = i32::MAX as i64;

/// A window: how many DATA octets may still be sent. It can go below zero when the peer
/// lowers SETTINGS_INITIAL_WINDOW_SIZE under octets already in flight (section 6.9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window(i64);

impl Window {
    pub fn new(size: u32) -> Self {
        Self(i64::from(size))
    }

    /// Octets that may be sent now.
    pub fn available(&self) -> usize {
        usize::try_from(self.0).unwrap_or(0)
    }

    /// Counts `len` octets sent (or, on a receive window, received). Receiving more than the
    /// window allows is the peer's FLOW_CONTROL_ERROR.
    pub fn consume(&mut self, len: u32) -> Result<(), ErrorCode> {
        let left = self.0 - i64::from(len);
        if left < 0 {
            return Err(ErrorCode::FlowControl);
        }
        self.0 = left;
        Ok(())
    }

    /// Applies a WINDOW_UPDATE: a window past 2^31-1 is a FLOW_CONTROL_ERROR.
    pub fn grant(&mut self, increment: u32) -> Result<(), ErrorCode> {
        let grown = self.0 + i64::from(increment);
        if grown > MAX_WINDOW {
            return Err(ErrorCode::FlowControl);
        }
        self.0 = grown;
        Ok(())
    }

    /// Moves a stream's window by the change in SETTINGS_INITIAL_WINDOW_SIZE.
    pub fn resize(&mut self, old_initial: u32, new_initial: u32) -> Result<(), ErrorCode> {
        let moved = self.0 + i64::from(new_initial) - i64::from(old_initial);
        if moved > MAX_WINDOW {
            return Err(ErrorCode::FlowControl);
        }
        self.0 = moved;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_down_and_refuses_overdrafts() {
        let mut w = Window::new(10);
        assert_eq!(w.consume(4), Ok(()));
        assert_eq!(w.available(), 6);
        assert_eq!(w.consume(7), Err(ErrorCode::FlowControl));
        assert_eq!(w.available(), 6);
    }

    #[test]
    fn grants_stop_at_two_to_the_31_minus_1() {
        let mut w = Window::new(DEFAULT_WINDOW);
        assert_eq!(w.grant(i32::MAX as u32 - DEFAULT_WINDOW), Ok(()));
        assert_eq!(w.grant(1), Err(ErrorCode::FlowControl));
    }

    #[test]
    fn a_smaller_initial_size_can_leave_a_window_below_zero() {
        let mut w = Window::new(DEFAULT_WINDOW);
        w.consume(60_000).unwrap_or_default();
        assert_eq!(w.resize(DEFAULT_WINDOW, 16_384), Ok(()));
        assert_eq!(w.available(), 0);
        // Credit must first cover the debt: 60,000 in flight against a window of 16,384.
        assert_eq!(w.grant(43_616), Ok(()));
        assert_eq!(w.available(), 0);
        assert_eq!(w.grant(1), Ok(()));
        assert_eq!(w.available(), 1);
    }
}
