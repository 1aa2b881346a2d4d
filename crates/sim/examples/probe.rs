use parcache_core::WritePolicyKind as W;
use parcache_sim::kotz92::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("fit") {
        let f = fit(1992);
        println!("{:?}", f);
        return;
    }
    let req: f64 = args
        .get(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(Overheads::FITTED.request_ms);
    let buf: f64 = args
        .get(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(Overheads::FITTED.buffer_ms);
    let paper = [
        ("lw1", 127.3, 16.4, 853.1, 55.7),
        ("seg", 6.9, 7.2, 63.3, 7.7),
        ("gw", 6.3, 6.1, 103.0, 8.7),
    ];
    for (pat, a, b, c, d) in paper {
        let mut row = vec![];
        for (rb, buffers, pub_) in [(1.0, 0, a), (1.0, 80, b), (0.25, 0, c), (0.25, 80, d)] {
            let p = KotzParams {
                pattern: pat.parse().unwrap(),
                record_blocks: rb,
                buffers,
                policy: W::WriteBack,
                overheads: Overheads {
                    request_ms: req,
                    buffer_ms: buf,
                },
                overhead_dist: std::env::var("OD")
                    .unwrap_or("exponential".into())
                    .parse()
                    .unwrap(),
                ..KotzParams::default()
            };
            eprintln!("run {pat} {rb} {buffers}");
            let r = run(&p).unwrap();
            row.push(format!(
                "{:8.1} ({:6.1} {:+5.1}%) w={} rm={} st={}",
                r.seconds,
                pub_,
                (r.seconds / pub_ - 1.0) * 100.0,
                r.disk_writes,
                r.rewrite_mistakes,
                r.stalls
            ));
        }
        println!("{pat}: {}", row.join(" | "));
    }
}
