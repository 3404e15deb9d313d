//! An empty program built with embed's profile: the baseline `tools/size.sh` subtracts to tell
//! what the runtime adds to an app binary.

fn main() {}
