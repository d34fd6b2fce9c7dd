//! A small scanner of Rust source for the structure check: comments and literals blanked out,
//! functions measured, imports between modules read, circles found. It reads code as written
//! in this workspace (rustfmt's layout), not every program the language allows.

use std::collections::BTreeSet;

/// A function: its name, the line of its `fn`, and its length from there to its closing brace.
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// The paths a file's imports name, from the crate root, items included (`a::b::X`).
pub type Imports = Vec<Vec<String>>;

fn ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with comments and the contents of string and character literals blanked out (each
/// character becomes a space, newlines stay), so that the braces and words left are code.
pub fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let n = literal_len(&c, i);
        if n == 0 {
            out.push(c[i]);
            i += 1;
            continue;
        }
        let end = (i + n).min(c.len());
        out.extend(
            c[i..end]
                .iter()
                .map(|&ch| if ch == '\n' { '\n' } else { ' ' }),
        );
        i = end;
    }
    out
}

/// The length of the comment or literal that starts at `i`, 0 when none does.
fn literal_len(c: &[char], i: usize) -> usize {
    let next = c.get(i + 1).copied();
    let word_before = i > 0 && ident(c[i - 1]);
    match (c[i], next) {
        ('/', Some('/')) => c[i..]
            .iter()
            .position(|&x| x == '\n')
            .unwrap_or(c.len() - i),
        ('/', Some('*')) => block_comment_len(c, i),
        ('"', _) => string_len(c, i),
        ('r', Some('"' | '#')) if !word_before => raw_string_len(c, i),
        ('b', Some('"')) if !word_before => 1 + string_len(c, i + 1),
        ('b', Some('r')) if !word_before => match raw_string_len(c, i + 1) {
            0 => 0,
            n => n + 1,
        },
        ('b', Some('\'')) if !word_before => match char_len(c, i + 1) {
            0 => 0,
            n => n + 1,
        },
        ('\'', _) => char_len(c, i),
        _ => 0,
    }
}

/// A `/* */` comment, nested ones included.
fn block_comment_len(c: &[char], i: usize) -> usize {
    let (mut depth, mut j) = (0usize, i);
    while j + 1 < c.len() {
        match (c[j], c[j + 1]) {
            ('/', '*') => {
                depth += 1;
                j += 2;
            }
            ('*', '/') => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return j - i;
                }
            }
            _ => j += 1,
        }
    }
    c.len() - i
}

/// A `"..."` string, escapes included.
fn string_len(c: &[char], i: usize) -> usize {
    let mut j = i + 1;
    while j < c.len() {
        match c[j] {
            '\\' => j += 2,
            '"' => return j - i + 1,
            _ => j += 1,
        }
    }
    c.len() - i
}

/// A `r#"..."#` string (0: `r` starts something else, such as the raw identifier `r#type`).
fn raw_string_len(c: &[char], i: usize) -> usize {
    let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
    if c.get(i + 1 + hashes) != Some(&'"') {
        return 0;
    }
    let mut j = i + 2 + hashes;
    while j < c.len() {
        if c[j] == '"'
            && c[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&x| x == '#')
                .count()
                == hashes
        {
            return j + 1 + hashes - i;
        }
        j += 1;
    }
    c.len() - i
}

/// A character literal (0: the quote starts a lifetime or a label).
fn char_len(c: &[char], i: usize) -> usize {
    if c.get(i + 1) == Some(&'\\') {
        return match c[(i + 3).min(c.len())..].iter().position(|&x| x == '\'') {
            Some(p) => p + 4,
            None => 0,
        };
    }
    if c.get(i + 2) == Some(&'\'') {
        3
    } else {
        0
    }
}

/// Whether `word` starts at `at`, not inside an identifier (nor after `$`, as in `$crate`).
fn word_at(c: &[char], at: usize, word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    c.len() >= at + w.len()
        && c[at..at + w.len()] == w[..]
        && (at == 0 || !(ident(c[at - 1]) || c[at - 1] == '$'))
}

/// The identifier at `i` (empty when none starts there).
fn read_ident(c: &[char], i: usize) -> String {
    c[i.min(c.len())..]
        .iter()
        .take_while(|&&x| ident(x))
        .collect()
}

fn skip_ws(c: &[char], mut i: usize) -> usize {
    while c.get(i).is_some_and(|x| x.is_whitespace()) {
        i += 1;
    }
    i
}

/// The brace that closes the one at `open`.
fn matching(c: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &x) in c.iter().enumerate().skip(open) {
        match x {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// The body of the item whose header starts at `from`: its braces, or `None` for a
/// declaration without one (`fn f();`).
fn body(c: &[char], from: usize) -> Option<(usize, usize)> {
    let mut depth = 0i32;
    for (k, &x) in c.iter().enumerate().skip(from) {
        match x {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            '{' if depth == 0 => return Some((k, matching(c, k)?)),
            ';' | '}' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// The line (from 1) of each character.
fn line_numbers(c: &[char]) -> Vec<usize> {
    let mut line = 1;
    c.iter()
        .map(|&x| {
            let here = line;
            if x == '\n' {
                line += 1;
            }
            here
        })
        .collect()
}

/// The functions of blanked code (see [`blank`]), nested ones included, in order.
pub fn functions(code: &str) -> Vec<Function> {
    let c: Vec<char> = code.chars().collect();
    let line = line_numbers(&c);
    let mut out = Vec::new();
    for at in 0..c.len() {
        if !word_at(&c, at, "fn") || !c.get(at + 2).is_some_and(|x| x.is_whitespace()) {
            continue;
        }
        let start = skip_ws(&c, at + 2);
        let dollar = usize::from(c.get(start) == Some(&'$'));
        let name = read_ident(&c, start + dollar);
        if name.is_empty() {
            continue;
        }
        if let Some((_, close)) = body(&c, start) {
            out.push(Function {
                name,
                line: line[at],
                lines: line[close] - line[at] + 1,
            });
        }
    }
    out
}

/// Inline modules (`mod tests { ... }`) of blanked code: their braces and names.
fn inline_modules(c: &[char]) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for at in 0..c.len() {
        if !word_at(c, at, "mod") || !c.get(at + 3).is_some_and(|x| x.is_whitespace()) {
            continue;
        }
        let start = skip_ws(c, at + 3);
        let name = read_ident(c, start);
        let open = skip_ws(c, start + name.len());
        if !name.is_empty() && c.get(open) == Some(&'{') {
            if let Some(close) = matching(c, open) {
                out.push((open, close, name));
            }
        }
    }
    out
}

/// Whether the path at `at` follows `in` (a visibility, `pub(in crate::a)`, not an import).
fn after_in(c: &[char], at: usize) -> bool {
    let mut k = at;
    while k > 0 && c[k - 1].is_whitespace() {
        k -= 1;
    }
    k >= 2 && c[k - 2..k] == ['i', 'n'] && (k == 2 || !ident(c[k - 3]))
}

/// The paths named by the use tree (or expression path) at `i`, under `prefix`; returns where
/// it ends.
fn use_tree(c: &[char], mut i: usize, mut path: Vec<String>, out: &mut Imports) -> usize {
    loop {
        i = skip_ws(c, i);
        if c.get(i) == Some(&'{') {
            i += 1;
            loop {
                i = skip_ws(c, i);
                if c.get(i).is_none_or(|&x| x == '}') {
                    return i + 1;
                }
                i = use_tree(c, i, path.clone(), out);
                while c.get(i).is_some_and(|&x| x != ',' && x != '}') {
                    i += 1;
                }
                if c.get(i) == Some(&',') {
                    i += 1;
                }
            }
        }
        let name = read_ident(c, i);
        i += name.len();
        if !name.is_empty() && name != "self" {
            path.push(name.clone());
        }
        if name.is_empty() || c.get(i..i + 2) != Some(&[':', ':'][..]) {
            out.push(path);
            return i;
        }
        i += 2;
    }
}

/// What the blanked code of module `module` (`["alloc", "pool"]`) imports through `super::`,
/// `self::` and `crate::<its room>::`, as paths from the crate root, in order.
pub fn imports(code: &str, module: &[String]) -> Imports {
    let c: Vec<char> = code.chars().collect();
    let inline = inline_modules(&c);
    let mut out = Imports::new();
    let mut at = 0;
    while at < c.len() {
        let prefix = ["super::", "self::", "crate::"]
            .into_iter()
            .find(|p| word_at(&c, at, p));
        let Some(prefix) = prefix.filter(|_| !after_in(&c, at)) else {
            at += 1;
            continue;
        };
        let mut base: Vec<String> = module.to_vec();
        base.extend(
            inline
                .iter()
                .filter(|(open, close, _)| *open < at && at < *close)
                .map(|(_, _, name)| name.clone()),
        );
        let mut i = at + prefix.len();
        match prefix {
            "crate::" => base.clear(),
            "super::" => {
                base.pop();
                while word_at(&c, i, "super::") {
                    base.pop();
                    i += "super::".len();
                }
            }
            _ => {}
        }
        let mut found = Imports::new();
        at = use_tree(&c, i, base, &mut found);
        out.extend(found.into_iter().filter(|p| p.first() == module.first()));
    }
    out
}

/// The circles among `modules` (each with what it imports): the strongly connected components
/// of more than one module, each sorted, in order of their first module.
pub fn circles(modules: &[(Vec<String>, Imports)]) -> Vec<Vec<String>> {
    let n = modules.len();
    let index = |path: &[String]| {
        (1..=path.len())
            .rev()
            .find_map(|k| modules.iter().position(|(m, _)| m[..] == path[..k]))
    };
    let edges: Vec<BTreeSet<usize>> = modules
        .iter()
        .enumerate()
        .map(|(i, (_, found))| {
            found
                .iter()
                .filter_map(|p| index(p))
                .filter(|&j| j != i)
                .collect()
        })
        .collect();
    let reach: Vec<Vec<bool>> = (0..n)
        .map(|start| {
            let mut seen = vec![false; n];
            let mut todo = vec![start];
            while let Some(i) = todo.pop() {
                for &j in &edges[i] {
                    if !std::mem::replace(&mut seen[j], true) {
                        todo.push(j);
                    }
                }
            }
            seen
        })
        .collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for (i, from_i) in reach.iter().enumerate() {
        let component: BTreeSet<String> = (0..n)
            .filter(|&j| j == i || (from_i[j] && reach[j][i]))
            .map(|j| modules[j].0.join("::"))
            .collect();
        if component.len() > 1 {
            out.insert(component.into_iter().collect());
        }
    }
    out.into_iter().collect()
}
