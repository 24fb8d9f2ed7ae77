// The timing half of both harnesses (appended to base.rs or head.rs by bench/pipeline-ab):
// `pipeline` RUNS times over the fixture, median and min.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&a[1]).expect("the fixture");
    let runs: usize = a.get(2).map_or(20, |s| s.parse().expect("RUNS"));
    let mut v = vec![];
    let mut x = 0;
    for _ in 0..runs {
        let t = std::time::Instant::now();
        x += pipeline(&bytes);
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    println!("{LABEL} median {:.2} ms min {:.2} ms ({x})", v[v.len() / 2] * 1e3, v[0] * 1e3);
}
