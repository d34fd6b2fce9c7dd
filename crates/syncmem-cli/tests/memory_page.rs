//! The memory page (`syncmem trace view`, `syncmem train --memory-html`), checked as a file
//! and in a real browser: headless Chromium runs its script (no error may reach the console),
//! a probe script (`memory_page/probe.js`) drives it with real DOM events (hover, wheel zoom,
//! the zoom buttons, a click on the peak, a drag), and a screenshot at 1280x800 must show the
//! drawing. The blocks the page lists at the peak of training are compared with the trace's
//! own data.
//!
//! Without Chromium the browser test prints a note and passes, unless
//! `SYNCMEM_REQUIRE_BROWSER=1` (CI sets it), where a missing browser fails it. The browser is
//! `$SYNCMEM_CHROMIUM`, else `chromium` or `chromium-browser` on the `PATH` (Debian's package
//! `chromium`; `scripts/setup.sh --with-browser` installs it). The screenshot is kept as
//! `target/tmp/memory-page.png` (the README's picture is one).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ok, ok_env, TempPath};

/// The browser to use, if any.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SYNCMEM_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

fn browser_required() -> bool {
    std::env::var("SYNCMEM_REQUIRE_BROWSER").is_ok_and(|v| v == "1")
}

/// Runs headless Chromium on `page` with `extra` arguments (a fresh profile, no network, no
/// background services); returns stdout. Gives up after two minutes (a hung browser).
fn run_chromium(browser: &Path, page: &Path, extra: &[&str]) -> String {
    let profile = TempPath::new("memory-page", "profile");
    // Into files: the dumped page is larger than a pipe holds while nobody reads it.
    let stdout = TempPath::new("memory-page", "chromium.out");
    let stderr = TempPath::new("memory-page", "chromium.err");
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,800",
        ])
        .arg(format!("--user-data-dir={}", profile.arg()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout.0).unwrap())
        .stderr(std::fs::File::create(&stderr.0).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", browser.display()));
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{} did not finish within two minutes", browser.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&profile.0);
    assert!(
        status.success(),
        "chromium failed ({status}): {}",
        std::fs::read_to_string(&stderr.0).unwrap_or_default()
    );
    std::fs::read_to_string(&stdout.0).unwrap()
}

/// The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes):
/// (width, height, RGB triples).
fn decode_png(bytes: &[u8]) -> (usize, usize, Vec<[u8; 3]>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut w, mut h, mut channels) = (0, 0, 0);
    let mut data = Vec::new();
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = &bytes[at + 4..at + 8];
        let body = &bytes[at + 8..at + 8 + len];
        match kind {
            b"IHDR" => {
                w = u32::from_be_bytes(body[0..4].try_into().unwrap()) as usize;
                h = u32::from_be_bytes(body[4..8].try_into().unwrap()) as usize;
                assert_eq!((body[8], body[12]), (8, 0), "8-bit, not interlaced");
                channels = match body[9] {
                    2 => 3,
                    6 => 4,
                    t => panic!("PNG colour type {t}"),
                };
            }
            b"IDAT" => data.extend_from_slice(body),
            _ => {}
        }
        at += 12 + len;
    }
    let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&data).expect("PNG data inflates");
    let stride = w * channels;
    let mut img = vec![0u8; h * stride];
    for y in 0..h {
        let row = &raw[y * (stride + 1)..(y + 1) * (stride + 1)];
        let (filter, src) = (row[0], &row[1..]);
        for x in 0..stride {
            let a = if x >= channels {
                img[y * stride + x - channels]
            } else {
                0
            };
            let b = if y > 0 { img[(y - 1) * stride + x] } else { 0 };
            let c = if y > 0 && x >= channels {
                img[(y - 1) * stride + x - channels]
            } else {
                0
            };
            let pred = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                4 => {
                    let p = i16::from(a) + i16::from(b) - i16::from(c);
                    let (pa, pb, pc) = (
                        (p - i16::from(a)).abs(),
                        (p - i16::from(b)).abs(),
                        (p - i16::from(c)).abs(),
                    );
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => panic!("PNG filter {f}"),
            };
            img[y * stride + x] = src[x].wrapping_add(pred);
        }
    }
    let px = img.chunks(channels).map(|p| [p[0], p[1], p[2]]).collect();
    (w, h, px)
}

/// Records three epochs of training with `syncmem trace record` and draws them.
fn recorded_page(name: &str) -> (TempPath, TempPath) {
    let trace = TempPath::new("memory-page", &format!("{name}.jsonl"));
    let page = TempPath::new("memory-page", &format!("{name}.html"));
    // Two mirrors, so that the host pool is used too (with zero-copy, training allocates no
    // host memory of its own: the page has the device pool only).
    ok_env(
        &["trace", "record", "--epochs", "3", "--out", trace.arg()],
        &[("SYNCMEM_ZERO_COPY", "off")],
    );
    let title = "memory of syncmem trace record --epochs 3";
    ok(&[
        "trace",
        "view",
        trace.arg(),
        "-o",
        page.arg(),
        "--title",
        title,
    ]);
    (trace, page)
}

/// Checks the page as a file: self-contained, one chart per pool, the phases with training
/// pressed, the blocks behind the peak named.
fn check_page_file(html: &str, device: &str) {
    check_pools(html, device, 2);
}

/// [`check_page_file`] for a page of at least `min_pools` pools: with one, the run was
/// zero-copy (one mirror per buffer, no host pool, syncs drawn as `mapped` marks); with two
/// or more, the host pool and the copies both ways are on the page.
fn check_pools(html: &str, device: &str, min_pools: usize) {
    for external in ["http://", "https://", "<link", " src=", "@import", "url("] {
        assert!(
            !html.contains(external),
            "the page refers to something outside: {external}"
        );
    }
    let pools = html.matches("<section class=\"pool\"").count();
    assert!(
        pools >= min_pools,
        "{min_pools} pools or more (device, host): {pools}"
    );
    assert_eq!(html.matches("<canvas class=\"chart\"").count(), pools);
    assert!(html.contains(&format!("data-pool=\"{device}\"")));
    let data = page_data(html);
    let kinds: Vec<&str> = data["pools"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["marks"].as_array().unwrap())
        .map(|m| m[0].as_str().unwrap())
        .collect();
    if min_pools >= 2 {
        assert!(html.contains("data-pool=\"host\""));
        // Copies as marks with their bytes.
        assert!(kinds.contains(&"host_to_device") && kinds.contains(&"device_to_host"));
    } else {
        assert!(
            !html.contains("data-pool=\"host\""),
            "zero-copy: no host pool"
        );
        assert!(kinds.contains(&"mapped"), "zero-copy syncs drawn");
        assert!(!kinds.contains(&"host_to_device"));
    }
    // The phases, training pressed; the steps; owners named behind the peak of training.
    let names: Vec<&str> = data["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "planning measurement",
            "set-up",
            "training",
            "after training"
        ]
    );
    assert!(html.contains("<button class=\"phase on\" data-phase=\"2\""));
    assert!(!data["steps"].as_array().unwrap().is_empty());
    assert!(html.contains("<th>peak of training</th>"));
    assert!(
        html.contains("<span class=\"named\">fc2_w</span>"),
        "fc2_w behind the peak"
    );
}

/// `html` with every block of the first pool carrying fields its event could carry beyond those
/// the page knows (an operator and frames), as the page embeds them.
fn with_frames(html: &str) -> String {
    let mut data = page_data(html);
    let extra = serde_json::json!({"operator": "FC", "frames": [{"name": "fc1", "filename": "mlp.rs", "line": 3}]});
    data["extras"] = serde_json::json!([extra]);
    let blocks = &mut data["pools"][0]["blocks"];
    let n = blocks["id"].as_array().unwrap().len();
    blocks["e"] = serde_json::json!(vec![0; n]);
    let key = "<script type=\"application/json\" id=\"data\">";
    let start = html.find(key).unwrap() + key.len();
    let end = start + html[start..].find("</script>").unwrap();
    format!("{}{}{}", &html[..start], data, &html[end..])
}

/// The JSON the page's script reads.
fn page_data(html: &str) -> serde_json::Value {
    let key = "<script type=\"application/json\" id=\"data\">";
    let start = html.find(key).expect("the page's data") + key.len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).expect("the data parses")
}

#[test]
fn the_page_of_a_training_run_renders_in_a_browser() {
    let Some(browser) = chromium() else {
        assert!(
            !browser_required(),
            "SYNCMEM_REQUIRE_BROWSER=1 but no Chromium found (set SYNCMEM_CHROMIUM or install \
             the `chromium` package: scripts/setup.sh --with-browser)"
        );
        println!("note: no Chromium found: the memory page was not checked in a browser");
        return;
    };
    let (trace, page) = recorded_page("browser");
    let html = std::fs::read_to_string(&page.0).unwrap();
    let first = trace_first_device(&trace.0);
    check_page_file(&html, &first);
    check_runs_clean(&browser, &page.0, &html);
    check_interaction(&browser, &html, &trace.0, &first);
    check_error_is_seen(&browser, &html);
    check_screenshot(&browser, &page.0);
}

/// The script runs without an error, and it filled each pool's state at the peak.
fn check_runs_clean(browser: &Path, page: &Path, html: &str) {
    let dom = run_chromium(browser, page, &["--dump-dom"]);
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page's script did not finish"
    );
    assert!(
        dom.contains("data-errors=\"0\""),
        "errors: {}",
        errors_of(&dom)
    );
    assert!(
        dom.contains("<pre id=\"errors\"></pre>"),
        "errors: {}",
        errors_of(&dom)
    );
    assert!(dom.contains("data-render-ms=") && dom.contains("data-loaded-ms="));
    let pools = html.matches("<section class=\"pool\"").count();
    assert_eq!(
        dom.matches("<div class=\"state\" data-pool=").count(),
        pools
    );
    assert_eq!(dom.matches("<table class=\"alive\">").count(), pools);
}

/// The peak of training of pool `device` in the trace file, from the trace's own lines: the
/// event just after which the most bytes were alive (first reached; the level at the start
/// of training counts), its bytes, and the ids of the blocks alive then.
fn training_peak(trace: &Path, device: &str) -> (usize, u64, Vec<u64>) {
    let text = std::fs::read_to_string(trace).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let first = lines.iter().position(|l| l.get("step").is_some()).unwrap();
    let last = lines.iter().rposition(|l| l.get("step").is_some()).unwrap();
    let mut live: std::collections::BTreeMap<u64, u64> = Default::default();
    let (mut best, mut at, mut alive) = (0u64, 0usize, Vec::new());
    for (i, l) in lines.iter().enumerate().take(last + 1) {
        if i == first && live.values().sum::<u64>() > 0 {
            (best, at, alive) = (live.values().sum(), i - 1, live.keys().copied().collect());
        }
        if l["device"] != device {
            continue;
        }
        let id = l["id"].as_u64();
        match l["op"].as_str() {
            Some("alloc") => {
                let size = l["place"]["size"].as_u64().or(l["size"].as_u64()).unwrap();
                live.insert(id.unwrap(), size);
            }
            Some("free") => {
                live.remove(&id.unwrap());
            }
            _ => continue,
        }
        let now: u64 = live.values().sum();
        if i >= first && now > best {
            (best, at, alive) = (now, i, live.keys().copied().collect());
        }
    }
    (at, best, alive)
}

/// Drives the page with the probe script (added to a copy of the page) and checks what it saw:
/// hover text at the peak, wheel zoom around the pointer, the zoom-out button, a click on the
/// peak listing exactly the blocks the trace has alive then, hovers over a listed block and a
/// block of the allocator's drawing, a pan by dragging, and no script error.
fn check_interaction(browser: &Path, html: &str, trace: &Path, device: &str) {
    let driven = TempPath::new("memory-page", "driven.html");
    let probe = format!(
        "<script>{}</script></body>",
        include_str!("memory_page/probe.js")
    );
    let html = with_frames(html).replace("</body>", &probe);
    std::fs::write(&driven.0, html).unwrap();
    let dom = run_chromium(browser, &driven.0, &["--dump-dom"]);
    assert!(
        dom.contains("data-errors=\"0\""),
        "errors: {}",
        errors_of(&dom)
    );
    let key = "data-probe=\"";
    let start = dom.find(key).expect("the probe ran") + key.len();
    let raw = &dom[start..start + dom[start..].find('"').unwrap()];
    let unescaped = raw
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let r: serde_json::Value = serde_json::from_str(&unescaped).unwrap();
    let view = |k: &str| (r[k][0].as_f64().unwrap(), r[k][1].as_f64().unwrap());
    let width = |v: (f64, f64)| v.1 - v.0;
    let (at, bytes, mut ids) = training_peak(trace, device);
    assert_eq!(r["peak"]["at"].as_u64(), Some(at as u64), "{r}");
    assert_eq!(r["peak"]["bytes"].as_u64(), Some(bytes));
    // Zoom in with the wheel around the peak, out with the button.
    let (v0, vw, vo) = (view("view0"), view("viewWheel"), view("viewOut"));
    let px = r["peak"]["x"].as_f64().unwrap();
    assert!((width(vw) / width(v0) - 0.8).abs() < 0.01, "{r}");
    assert!(
        vw.0 <= px && px <= vw.1,
        "the wheel zooms around the pointer: {r}"
    );
    assert!(width(vo) > width(vw) * 1.5, "{r}");
    // The click on the peak lists the blocks alive then.
    assert_eq!(r["clicked"].as_u64(), Some(at as u64));
    let mut listed: Vec<u64> = r["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    listed.sort_unstable();
    ids.sort_unstable();
    assert_eq!(listed, ids, "the blocks alive at the peak of training");
    assert_eq!(r["rows"].as_u64(), Some(ids.len().min(400) as u64));
    assert!(
        r["segments"].as_u64().unwrap() >= 1,
        "the allocator's segments drawn"
    );
    // Hover texts: owner, size, stream.
    let chart = r["hoverChart"].as_str().unwrap();
    assert!(
        chart.contains("allocated") && chart.contains("block(s)"),
        "{chart}"
    );
    assert!(chart.contains("stream"), "{chart}");
    let row = r["hoverRow"].as_str().unwrap();
    let owner = r["firstOwner"].as_str().unwrap();
    assert!(
        row.starts_with(&format!("{owner}: ")) && row.contains("stream"),
        "{row}"
    );
    assert!(r["hoverBlock"].as_str().unwrap().contains("allocated at"));
    // A field of the block's event the page does not know by name is shown as it is.
    for text in [chart, row] {
        assert!(text.contains("operator: FC"), "{text}");
        assert!(text.contains("fc1 (mlp.rs:3)"), "{text}");
    }
    // Dragging right shows earlier times, at the same zoom.
    let vp = view("viewPan");
    assert!(vp.0 < v0.0 && (width(vp) - width(v0)).abs() < 1.0, "{r}");
}

/// The same check sees an error when there is one: a page whose script logs one.
fn check_error_is_seen(browser: &Path, html: &str) {
    let broken = TempPath::new("memory-page", "broken.html");
    let bad = html.replace("</body>", "<script>console.error('boom')</script></body>");
    std::fs::write(&broken.0, bad).unwrap();
    let dom = run_chromium(browser, &broken.0, &["--dump-dom"]);
    assert!(dom.contains("data-errors=\"1\""), "an error was not caught");
    assert!(errors_of(&dom).contains("boom"));
}

/// The screenshot at 1280x800 shows the charts: the stacked bands in the page's palette and
/// the reserved line, on a page that is not blank.
fn check_screenshot(browser: &Path, page: &Path) {
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memory-page.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        browser,
        page,
        &[&format!("--screenshot={}", shot.display())],
    );
    let (w, h, px) = decode_png(&std::fs::read(&shot).expect("the screenshot"));
    assert_eq!((w, h), (1280, 800));
    let count = |rgb: [u8; 3]| {
        px.iter()
            .filter(|p| p.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 8))
            .count()
    };
    let white = count([255, 255, 255]);
    assert!(
        white < w * h * 95 / 100,
        "the screenshot is blank: {white} white pixels"
    );
    // The first colours of the palette, one band each.
    let palette = [[0x4e, 0x79, 0xa7], [0xf2, 0x8e, 0x2b], [0x59, 0xa1, 0x4f]];
    let bands = palette.iter().filter(|c| count(**c) > 500).count();
    assert!(bands >= 2, "the stacked bands: {bands} colours");
    let reserved = count([0xe8, 0x87, 0x1e]);
    assert!(reserved > 200, "the reserved line: {reserved} pixels");
    println!("screenshot: {}", shot.display());
}

/// The first pool of the trace that is a device (its label).
fn trace_first_device(trace: &Path) -> String {
    let text = std::fs::read_to_string(trace).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["device"].as_str().map(str::to_string))
        .find(|d| d != "host" && !d.ends_with(" pinned"))
        .expect("a device pool in the trace")
}

/// The text of the page's `#errors` in a dumped DOM.
fn errors_of(dom: &str) -> String {
    let start = dom.find("<pre id=\"errors\">").map_or(0, |i| i + 17);
    let end = dom[start..].find("</pre>").map_or(dom.len(), |i| start + i);
    dom[start..end].to_string()
}

#[test]
fn trace_view_writes_a_self_contained_page() {
    let (trace, page) = recorded_page("file");
    let html = std::fs::read_to_string(&page.0).unwrap();
    check_page_file(&html, &trace_first_device(&trace.0));
    // The trace carries the plan of the planned train net: every planner slot on the page is
    // named by the blobs it holds, and the note for unnamed slots is absent.
    let text = std::fs::read_to_string(&trace.0).unwrap();
    assert!(text.contains("\"op\":\"plan\""), "no plan in the trace");
    let data = page_data(&html);
    let slots = data["slots"].as_object().expect("slots");
    let owners: Vec<&str> = data["owners"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.as_str())
        .filter(|o| o.trim_start_matches('_').starts_with("shared_") && o.starts_with('_'))
        .collect();
    assert!(!owners.is_empty(), "no planner slot among the owners");
    for o in owners {
        let blobs = slots.get(o).and_then(|b| b.as_array());
        assert!(
            blobs.is_some_and(|b| !b.is_empty()),
            "{o} unnamed: {slots:?}"
        );
    }
    assert!(!html.contains("This trace does not record which blob"));
    // A trace that cannot be read: an error naming it, no page.
    let bad = TempPath::new("memory-page", "bad.jsonl");
    std::fs::write(&bad.0, "{\"op\":\"alloc\"}\n").unwrap();
    let out = TempPath::new("memory-page", "bad.html");
    let err = common::fails(&["trace", "view", bad.arg(), "-o", out.arg()]);
    assert!(err.contains("line 1"), "{err}");
    assert!(!out.0.exists());
    let err = common::fails(&["trace", "view", trace.arg(), "-o", "/no-such-dir/x.html"]);
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn train_writes_the_page_of_its_run() {
    let page = TempPath::new("memory-page", "train.html");
    let out = ok(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--memory-html",
        page.arg(),
    ]);
    assert!(out.contains("memory page of the run"), "{out}");
    let html = std::fs::read_to_string(&page.0).unwrap();
    // Zero-copy on cpu: the device pool holds every buffer, the host pool is never used.
    check_pools(&html, "cpu", 1);
    assert!(html.contains("syncmem train on cpu: 2 epoch(s)"));
    // The run's plan names its slots: each holds blobs of the net.
    let slots = page_data(&html)["slots"].clone();
    let slots = slots.as_object().expect("slots");
    assert!(!slots.is_empty(), "the plan's slots");
    assert!(
        slots.keys().all(|k| k.starts_with("__shared_")),
        "{slots:?}"
    );
    let err = common::fails(&["train", "--memory-html", "/no-such-dir/x.html"]);
    assert!(err.contains("does not exist"), "{err}");
}
