fn main() {
    eprintln!("saltgate-minion: not built yet (issue 9)");
    std::process::exit(2);
}
