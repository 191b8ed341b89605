//! What the chaos tests share.

use std::path::Path;

/// The broker binary cargo built for these tests.
pub fn queen_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}
