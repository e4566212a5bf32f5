//! /proc/allocinfo: parse every format the kernel has printed, diff, watch. (Owned by issue 5.)

pub mod cli;
