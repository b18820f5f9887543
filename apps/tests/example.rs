//! Runs the README's example (`examples/quickstart.rs`) as part of the test suite.

#[path = "../../examples/quickstart.rs"]
mod quickstart;

#[test]
fn quickstart_example_runs() {
    quickstart::main().unwrap();
}
