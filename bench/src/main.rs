fn main() {
    eprintln!("saltgate-bench: not built yet (issue 11)");
    std::process::exit(2);
}
