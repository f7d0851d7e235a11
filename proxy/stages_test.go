package proxy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The configs PUT's stages are listed three times: configs.go's doc comment (the
// source), README.md's Layout table and docs/operations.md's stage table. These tests
// hold the other two to the first, and the files each names to the tree.

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// commentStages are the stages of configs.go's doc comment: the indented lines after
// "a pipeline of stages", up to the first empty comment line after them.
func commentStages(t *testing.T) []string {
	src := readDoc(t, "configs.go")
	_, after, ok := strings.Cut(src, "is a pipeline of stages")
	if !ok {
		t.Fatal(`configs.go: no "is a pipeline of stages" comment`)
	}
	var stages []string
	for _, line := range strings.Split(after, "\n")[1:] {
		if line == "//" && len(stages) > 0 {
			break
		}
		if name, ok := strings.CutPrefix(line, "//\t"); ok {
			stages = append(stages, strings.Fields(name)[0])
		}
	}
	return stages
}

// tableRow is the row of a Markdown table whose first cell is first, its cells trimmed.
func tableRow(t *testing.T, doc, name, first string) []string {
	t.Helper()
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) > 1 && strings.TrimPrefix(cells[0], "| ") == first {
			return cells
		}
	}
	t.Fatalf("%s: no table row for %s", name, first)
	return nil
}

// readmeStages are the stages README's Layout row for proxy lists after "runs them — ":
// the first word of each part between arrows outside parentheses, up to the first ';'
// outside them.
func readmeStages(t *testing.T, row string) []string {
	_, chain, ok := strings.Cut(row, "runs them — ")
	if !ok {
		t.Fatal(`README.md: the proxy row says no "runs them — "`)
	}
	var parts []string
	depth, start := 0, 0
scan:
	for i, r := range chain {
		switch {
		case r == '(':
			depth++
		case r == ')':
			depth--
		case depth == 0 && r == '→':
			parts = append(parts, chain[start:i])
			start = i + len("→")
		case depth == 0 && r == ';':
			parts = append(parts, chain[start:i])
			break scan
		}
	}
	var stages []string
	for _, p := range parts {
		if f := strings.Fields(p); len(f) > 0 {
			stages = append(stages, f[0])
		}
	}
	return stages
}

// opsStages are the first cells of operations.md's stage table.
func opsStages(t *testing.T, doc string) []string {
	_, table, ok := strings.Cut(doc, "| stage | file | takes | gives |\n|---|---|---|---|\n")
	if !ok {
		t.Fatal("docs/operations.md: no stage table")
	}
	var stages []string
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		stages = append(stages, strings.Split(line, " | ")[0][2:])
	}
	return stages
}

func TestStagesListedAlike(t *testing.T) {
	want := commentStages(t)
	if len(want) < 4 {
		t.Fatalf("configs.go lists %q: fewer stages than the pipeline has", want)
	}
	readme := readDoc(t, "../README.md")
	if got := readmeStages(t, strings.Join(tableRow(t, readme, "README.md", "`proxy`"), " | ")); !slices.Equal(got, want) {
		t.Errorf("README.md's Layout lists the stages %q; configs.go %q", got, want)
	}
	if got := opsStages(t, readDoc(t, "../docs/operations.md")); !slices.Equal(got, want) {
		t.Errorf("docs/operations.md's stage table lists %q; configs.go %q", got, want)
	}
}

var goFile = regexp.MustCompile("`([a-z_]+\\.go)`")

// TestLayoutNamesFilesThatExist: each Go file README's Layout names for a package
// directory is in it, and each file of operations.md's stage table is in proxy (or,
// named with its package's path, there).
func TestLayoutNamesFilesThatExist(t *testing.T) {
	exists := func(dir, file string) bool {
		_, err := os.Stat(filepath.Join("..", dir, file))
		return err == nil
	}
	readme := readDoc(t, "../README.md")
	_, layout, _ := strings.Cut(readme, "## Layout")
	layout, _, _ = strings.Cut(layout, "\n## ")
	for _, line := range strings.Split(layout, "\n") {
		cells := strings.Split(line, " | ")
		dir := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")
		if fi, err := os.Stat(filepath.Join("..", dir)); len(cells) < 2 || err != nil || !fi.IsDir() {
			continue // not a row, or not a directory of the tree
		}
		for _, m := range goFile.FindAllStringSubmatch(cells[1], -1) {
			if !exists(dir, m[1]) {
				t.Errorf("README.md's Layout names %s in %s: there is no such file", m[1], dir)
			}
		}
	}
	for _, stage := range commentStages(t) {
		cells := tableRow(t, readDoc(t, "../docs/operations.md"), "docs/operations.md", stage)
		for _, m := range goFile.FindAllStringSubmatch(cells[1], -1) {
			if !exists("proxy", m[1]) {
				t.Errorf("docs/operations.md's %s stage names %s: proxy has no such file", stage, m[1])
			}
		}
		for _, dir := range regexp.MustCompile("`(internal/[a-z]+)`").FindAllStringSubmatch(cells[1], -1) {
			if !exists(dir[1], "") {
				t.Errorf("docs/operations.md's %s stage names %s: no such package", stage, dir[1])
			}
		}
	}
}
