package testutil

import (
	"bufio"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	// mdLink is a Markdown link or image: [text](target) or ![alt](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// docsPath is a page of docs/ named from the repository's root, as
	// comments, scripts and the Makefile name them.
	docsPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.(?:md|svg))`)
)

// TestLinks fails on a relative Markdown link to a file that does not exist,
// and on a docs/ page named in a comment, script or page that does not: a
// page moved without its links fixed.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from the test's directory: %v", err)
	}
	var files, links int
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "results" || name == "bin") {
				return fs.SkipDir
			}
			return nil
		}
		if !checked(name) {
			return nil
		}
		files++
		rel, _ := filepath.Rel(root, path)
		n, bad := checkLinks(root, path)
		links += n
		for _, b := range bad {
			t.Errorf("%s:%d: %s: no such file", rel, b.line, b.target)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 || links == 0 {
		t.Fatalf("read %d files and %d links: the walk found nothing to check", files, links)
	}
}

// checked reports whether a file's links are checked: Markdown, and the
// sources whose comments name docs/ pages.
func checked(name string) bool {
	switch filepath.Ext(name) {
	case ".md", ".go", ".sh", ".c", ".h", ".py":
		return true
	}
	return name == "Makefile"
}

type brokenLink struct {
	line   int
	target string
}

// checkLinks returns how many links the file at path holds and those whose
// target is missing.
func checkLinks(root, path string) (int, []brokenLink) {
	f, err := os.Open(path)
	if err != nil {
		return 0, []brokenLink{{0, err.Error()}}
	}
	defer f.Close()
	var n int
	var bad []brokenLink
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.HasSuffix(path, ".md") {
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				n++
				if _, err := os.Stat(filepath.Join(filepath.Dir(path), filepath.FromSlash(target))); err != nil {
					bad = append(bad, brokenLink{line, m[1]})
				}
			}
		}
		for _, m := range docsPath.FindAllStringSubmatch(text, -1) {
			n++
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(m[1]))); err != nil {
				bad = append(bad, brokenLink{line, m[1]})
			}
		}
	}
	if err := sc.Err(); err != nil {
		bad = append(bad, brokenLink{0, err.Error()})
	}
	return n, bad
}

// TestPackagesListed fails when a package of the module is missing from
// docs/design/packages.md, the map of the packages.
func TestPackagesListed(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "design", "packages.md"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "integrations" || name == "results" || name == "bin") {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			pkgs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) == 0 {
		t.Fatal("found no package")
	}
	for _, p := range slices.Sorted(maps.Keys(pkgs)) {
		if !strings.Contains(string(page), "`"+p+"`") {
			t.Errorf("package %s is not in docs/design/packages.md", p)
		}
	}
}
