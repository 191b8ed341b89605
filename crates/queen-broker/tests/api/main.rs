//! API tests: each starts a broker in-process on its own database and speaks HTTP to it.

mod bad_input;
mod fusion;
mod groups;
mod helpers;
mod long_poll;
mod messages;
mod storage;
