//! The what-if simulation: what each critical section costs ([`timing`]), the discrete-event
//! simulation of the vmap locks ([`des`]), and the inputs a recording can measure for both
//! ([`calibration`], with the sections measured after a wait in [`after_wait`] and the drain's
//! place in the worker pool's queue in [`drain_queue`]).
//!
//! It lives apart from `replay` and `synth` because both use it: free-running replay turns the
//! model's operations into timed sections, and `synth` lays out its streams with the same costs.
//! Nothing here reads files or clocks; `vmtrace calibrate` is the I/O edge.

pub mod after_wait;
pub mod calibration;
pub mod des;
pub mod drain_queue;
pub mod timing;
