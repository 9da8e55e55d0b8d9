fn main() {
    eprintln!("saltgate-master: not built yet (issue 8)");
    std::process::exit(2);
}
