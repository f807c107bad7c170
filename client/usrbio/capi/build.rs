// The shared library's soname, so programs record `libhf3fs_api_shared.so`
// (not the build path) as their dependency.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhf3fs_api_shared.so");
    println!("cargo:rerun-if-changed=build.rs");
}
