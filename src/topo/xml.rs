//! NCCL's topology XML, read and written: a tree of elements with attributes.
//!
//! The files NCCL reads (`NCCL_TOPO_FILE`) and writes (`NCCL_TOPO_DUMP_FILE`) use a small part
//! of XML: an optional `<?xml ...?>` declaration, comments, elements with attributes, and no
//! text content. This reader accepts exactly that part and reports the line and what it
//! expected for anything else; it is a few hundred lines and adds no dependency to the library.
//! Detection builds the same tree, so dumping what was detected and loading it again is the
//! identity.
#![forbid(unsafe_code)]

use std::fmt;

/// One element: `<name attr="value" ...>children</name>`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Elem {
    /// Tag name (`system`, `cpu`, `pci`, `gpu`, `nvlink`, `nic`, `net`).
    pub name: String,
    /// Attributes in file order.
    pub attrs: Vec<(String, String)>,
    /// Child elements in file order.
    pub children: Vec<Elem>,
    /// Line of the opening tag in the file it was read from (0 when built in memory).
    pub line: usize,
}

/// A malformed file: the line and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError {
    /// 1-based line.
    pub line: usize,
    /// What was wrong, e.g. `expected '>' after attributes of <pci>`.
    pub msg: String,
}

impl fmt::Display for XmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for XmlError {}

impl Elem {
    /// An element with no attributes or children.
    pub fn new(name: &str) -> Elem {
        Elem {
            name: name.to_string(),
            ..Elem::default()
        }
    }

    /// The value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets attribute `key` (replacing an existing value, else appending).
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> &mut Elem {
        let value = value.into();
        match self.attrs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.attrs.push((key.to_string(), value)),
        }
        self
    }

    /// Builder form of [`Elem::set`].
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Elem {
        self.set(key, value);
        self
    }

    /// Builder: appends a child.
    pub fn child(mut self, c: Elem) -> Elem {
        self.children.push(c);
        self
    }

    /// The first child named `name`.
    pub fn find(&self, name: &str) -> Option<&Elem> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The tree as XML text, two spaces per level, as NCCL writes it.
    pub fn to_xml(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        out.push_str(&"  ".repeat(depth));
        out.push('<');
        out.push_str(&self.name);
        for (k, v) in &self.attrs {
            out.push(' ');
            out.push_str(k);
            out.push_str("=\"");
            escape(v, out);
            out.push('"');
        }
        if self.children.is_empty() {
            out.push_str("/>\n");
            return;
        }
        out.push_str(">\n");
        for c in &self.children {
            c.write(out, depth + 1);
        }
        out.push_str(&"  ".repeat(depth));
        out.push_str("</");
        out.push_str(&self.name);
        out.push_str(">\n");
    }

    /// Whether two trees hold the same elements and attributes (line numbers aside).
    pub fn same_as(&self, other: &Elem) -> bool {
        self.name == other.name
            && self.attrs == other.attrs
            && self.children.len() == other.children.len()
            && self
                .children
                .iter()
                .zip(&other.children)
                .all(|(a, b)| a.same_as(b))
    }
}

fn escape(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

/// Parses a document with one root element.
pub fn parse(text: &str) -> Result<Elem, XmlError> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        line: 1,
    };
    p.skip_misc()?;
    if p.i >= p.s.len() {
        return Err(p.err("expected a root element such as <system>, found end of file"));
    }
    let root = p.element(0)?;
    p.skip_misc()?;
    if p.i < p.s.len() {
        return Err(p.err("expected end of file after the root element"));
    }
    Ok(root)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    line: usize,
}

/// Nesting deeper than this is refused (a PCI tree is a handful of levels).
const MAX_DEPTH: usize = 64;

impl Parser<'_> {
    fn err(&self, msg: impl Into<String>) -> XmlError {
        XmlError {
            line: self.line,
            msg: msg.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn bump(&mut self) {
        if self.peek() == Some(b'\n') {
            self.line += 1;
        }
        self.i += 1;
    }

    fn starts(&self, pat: &str) -> bool {
        self.s[self.i..].starts_with(pat.as_bytes())
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.bump();
        }
    }

    /// Skips white space, comments and `<?...?>` declarations.
    fn skip_misc(&mut self) -> Result<(), XmlError> {
        loop {
            self.skip_ws();
            if self.starts("<!--") {
                self.skip_until("-->", "comment")?;
            } else if self.starts("<?") {
                self.skip_until("?>", "declaration")?;
            } else {
                return Ok(());
            }
        }
    }

    fn skip_until(&mut self, end: &str, what: &str) -> Result<(), XmlError> {
        let start = self.line;
        while self.i < self.s.len() {
            if self.starts(end) {
                self.i += end.len();
                return Ok(());
            }
            self.bump();
        }
        Err(XmlError {
            line: start,
            msg: format!("{what} opened here is not closed by '{end}'"),
        })
    }

    fn name(&mut self, what: &str) -> Result<String, XmlError> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':') {
                self.i += 1;
            } else {
                break;
            }
        }
        if start == self.i {
            let found = self.found();
            return Err(self.err(format!("expected {what}, found {found}")));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn found(&self) -> String {
        match self.s.get(self.i..) {
            Some(rest) if !rest.is_empty() => {
                let ch = String::from_utf8_lossy(&rest[..rest.len().min(12)]).into_owned();
                format!("{:?}", ch.lines().next().unwrap_or(""))
            }
            _ => "end of file".to_string(),
        }
    }

    fn element(&mut self, depth: usize) -> Result<Elem, XmlError> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("elements nested deeper than {MAX_DEPTH}")));
        }
        if self.peek() != Some(b'<') {
            let found = self.found();
            return Err(self.err(format!("expected '<' opening an element, found {found}")));
        }
        self.i += 1;
        let mut e = Elem {
            line: self.line,
            name: self.name("an element name after '<'")?,
            ..Elem::default()
        };
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'/') => {
                    self.i += 1;
                    if self.peek() != Some(b'>') {
                        return Err(self.err(format!("expected '>' after '/' in <{}>", e.name)));
                    }
                    self.i += 1;
                    return Ok(e);
                }
                Some(b'>') => {
                    self.i += 1;
                    break;
                }
                None => {
                    return Err(self.err(format!(
                        "expected '>' or an attribute in <{}>, found end of file",
                        e.name
                    )))
                }
                Some(_) => {
                    let key = self.name(&format!("an attribute name or '>' in <{}>", e.name))?;
                    self.skip_ws();
                    if self.peek() != Some(b'=') {
                        return Err(self.err(format!("expected '=' after attribute {key}")));
                    }
                    self.i += 1;
                    self.skip_ws();
                    let value = self.value(&key)?;
                    if e.attr(&key).is_some() {
                        return Err(self.err(format!("attribute {key} repeated in <{}>", e.name)));
                    }
                    e.attrs.push((key, value));
                }
            }
        }
        loop {
            self.skip_misc()?;
            if self.starts("</") {
                self.i += 2;
                let close = self.name("an element name after '</'")?;
                if close != e.name {
                    return Err(self.err(format!(
                        "expected </{}> closing the element of line {}, found </{close}>",
                        e.name, e.line
                    )));
                }
                self.skip_ws();
                if self.peek() != Some(b'>') {
                    return Err(self.err(format!("expected '>' after </{close}")));
                }
                self.i += 1;
                return Ok(e);
            }
            if self.i >= self.s.len() {
                return Err(self.err(format!(
                    "expected </{}> closing the element of line {}, found end of file",
                    e.name, e.line
                )));
            }
            if self.peek() != Some(b'<') {
                return Err(self.err(format!(
                    "expected a child element or </{}>, found text {}",
                    e.name,
                    self.found()
                )));
            }
            let c = self.element(depth + 1)?;
            e.children.push(c);
        }
    }

    fn value(&mut self, key: &str) -> Result<String, XmlError> {
        let q = match self.peek() {
            Some(q @ (b'"' | b'\'')) => q,
            _ => return Err(self.err(format!("expected a quoted value for attribute {key}"))),
        };
        let start_line = self.line;
        self.i += 1;
        let start = self.i;
        while let Some(c) = self.peek() {
            if c == q {
                let raw = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                self.i += 1;
                return unescape(&raw).map_err(|m| self.err(format!("attribute {key}: {m}")));
            }
            if c == b'<' {
                return Err(self.err(format!("'<' inside the value of attribute {key}")));
            }
            self.bump();
        }
        Err(XmlError {
            line: start_line,
            msg: format!("value of attribute {key} is not closed by {}", q as char),
        })
    }
}

fn unescape(raw: &str) -> Result<String, String> {
    if !raw.contains('&') {
        return Ok(raw.to_string());
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(p) = rest.find('&') {
        out.push_str(&rest[..p]);
        let tail = &rest[p..];
        let end = tail
            .find(';')
            .ok_or_else(|| format!("'&' without ';' in {raw:?}"))?;
        let ent = &tail[1..end];
        let c = match ent {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let n = ent
                    .strip_prefix("#x")
                    .map(|h| u32::from_str_radix(h, 16))
                    .or_else(|| ent.strip_prefix('#').map(|d| d.parse::<u32>()))
                    .and_then(Result::ok)
                    .and_then(char::from_u32);
                n.ok_or_else(|| format!("unknown entity &{ent}; in {raw:?}"))?
            }
        };
        out.push(c);
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_elements_attributes_comments_and_lines() {
        let text = "<?xml version=\"1.0\"?>\n<!-- a box -->\n<system version=\"1\">\n  <cpu numaid='0' vendor=\"A&amp;B\">\n    <pci busid=\"0000:01:00.0\"/>\n  </cpu>\n</system>\n";
        let e = parse(text).unwrap();
        assert_eq!(e.name, "system");
        assert_eq!(e.line, 3);
        let cpu = e.find("cpu").unwrap();
        assert_eq!(cpu.attr("vendor"), Some("A&B"));
        assert_eq!(cpu.line, 4);
        assert_eq!(cpu.children[0].attr("busid"), Some("0000:01:00.0"));
        assert_eq!(cpu.children[0].line, 5);
        let again = parse(&e.to_xml()).unwrap();
        assert!(again.same_as(&e));
    }

    #[test]
    fn errors_name_the_line_and_what_was_expected() {
        let cases = [
            ("<system>\n<cpu>\n</system>", 3, "expected </cpu>"),
            ("<system>\n<cpu numaid=0/>\n</system>", 2, "quoted value"),
            ("<system>\n text\n</system>", 2, "found text"),
            ("<system>\n<cpu\n", 3, "end of file"),
            ("", 1, "root element"),
            ("<a/>\n<b/>", 2, "end of file after"),
            ("<a x=\"1\" x=\"2\"/>", 1, "repeated"),
            ("<a>\n<!-- open\n", 2, "comment"),
            ("<a x=\"&bogus;\"/>", 1, "unknown entity"),
        ];
        for (text, line, want) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.msg.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn escapes_round_trip() {
        let e = Elem::new("net").with("name", "a<b>&\"c\"");
        let back = parse(&e.to_xml()).unwrap();
        assert_eq!(back.attr("name"), Some("a<b>&\"c\""));
    }
}
