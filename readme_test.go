package pgfence_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeGoBlocksCompile compiles every ```go block of README.md with
// the go command: a whole program (package main) as it is, a fragment as
// the body of a function in a package that declares what the README's
// fragments share (ctx, pool, token, must, ...). A block that uses a module
// of its own (examples/sqlc, otelpgfence) is compiled in that module. The
// files live in an overlay (go build -overlay), so nothing is written into
// the tree, and errors name README.md's lines through //line directives.
// The control: stale blocks (UnderLease without the lease's secret, a
// program with a type error) fail the same check.
func TestReadmeGoBlocksCompile(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	blocks := goBlocks("README.md", string(readme))
	require.GreaterOrEqual(t, len(blocks), 4, "README.md has its Go blocks")

	out, err := compileBlocks(t, blocks)
	require.NoError(t, err, "README.md's Go blocks must compile:\n%s", out)

	t.Run("control", func(t *testing.T) {
		controls := goBlocks("control.md", "```go\n"+
			"stmt := fence.Update(\"accounts\").Set(\"balance = $1\").Where(\"id = $2\").UnderLease(\"account:42\")\n"+
			"_, err := stmt.Exec(ctx, pool, token, 10, 42)\nmust(err)\n```\n\n"+
			"```go\npackage main\n\nimport \"github.com/pgfence/pgfence\"\n\n"+
			"func main() { var s pgfence.Secret = \"text\"; _ = s }\n```\n")
		require.Len(t, controls, 2)
		for i, want := range []string{
			"control.md:2:",  // the fragment's first line: UnderLease without the secret
			"control.md:12:", // the program's func main
		} {
			out, err := compileBlocks(t, controls[i:i+1])
			require.Error(t, err, "a broken block must fail the check")
			require.Contains(t, out, want, "the error names the block's line in its file")
			t.Logf("control %d fails as it should:\n%s", i, out)
		}
	})
}

// goBlock is one ```go block: its text and the line of its first line.
type goBlock struct {
	file string
	line int
	code string
}

// goBlocks returns the ```go blocks of the Markdown text md.
func goBlocks(file, md string) []goBlock {
	var blocks []goBlock
	var cur *goBlock
	for i, l := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &goBlock{file: file, line: i + 2}
		case cur != nil && strings.TrimSpace(l) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += l + "\n"
		}
	}
	return blocks
}

// readmeModule is a module the README's blocks are compiled in: its
// directory, relative to the repository, the word in a block that selects
// it, and the declarations its fragments may use besides the shared ones.
type readmeModule struct {
	dir, marker, prelude string
	imports              []string
}

var readmeModules = []readmeModule{
	{dir: "examples/sqlc", marker: "ledgerdb.", prelude: "var q *ledgerdb.Queries\n",
		imports: []string{`"github.com/pgfence/pgfence/examples/sqlc/ledgerdb"`}},
	{dir: "otelpgfence", marker: "otelpgfence.", prelude: "var reg *prometheus.Registry\n",
		imports: []string{`"github.com/prometheus/client_golang/prometheus"`}},
	{dir: "."}, // the rest
}

// readmePrelude is what every fragment may use without declaring it.
const readmePrelude = `
var (
	ctx      = context.Background()
	pool     *pgxpool.Pool
	tx       pgx.Tx
	err      error
	token    int64
	oldToken int64
	secret   pgfence.Secret
)

func must(err error) {
	if err != nil {
		panic(err)
	}
}
`

var readmePreludeImports = []string{`"context"`, `"github.com/jackc/pgx/v5"`,
	`"github.com/jackc/pgx/v5/pgxpool"`, `"github.com/pgfence/pgfence"`}

// readmePackages maps the package names fragments use to import paths.
var readmePackages = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "time": "time", "log": "log",
	"os": "os", "sql": "database/sql",
	"pgx": "github.com/jackc/pgx/v5", "pgxpool": "github.com/jackc/pgx/v5/pgxpool",
	"pgconn": "github.com/jackc/pgx/v5/pgconn", "stdlib": "github.com/jackc/pgx/v5/stdlib",
	"pgfence": "github.com/pgfence/pgfence", "fence": "github.com/pgfence/pgfence/fence",
	"leasetable": "github.com/pgfence/pgfence/leasetable", "advisory": "github.com/pgfence/pgfence/advisory",
	"leader": "github.com/pgfence/pgfence/leader", "migrations": "github.com/pgfence/pgfence/migrations",
	"ledgerdb":    "github.com/pgfence/pgfence/examples/sqlc/ledgerdb",
	"otelpgfence": "github.com/pgfence/pgfence/otelpgfence",
	"otelprom":    "go.opentelemetry.io/otel/exporters/prometheus",
	"sdkmetric":   "go.opentelemetry.io/otel/sdk/metric",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
}

// compileBlocks builds blocks with go build, one package per block, in the
// module each belongs to, and returns the go command's output.
func compileBlocks(t *testing.T, blocks []goBlock) (string, error) {
	t.Helper()
	root, err := os.Getwd()
	require.NoError(t, err)
	tmp := t.TempDir()
	byModule := map[string][]string{} // module dir -> package dirs
	overlay := map[string]string{}
	for i, b := range blocks {
		m := readmeModules[len(readmeModules)-1]
		for _, c := range readmeModules {
			if c.marker != "" && strings.Contains(b.code, c.marker) {
				m = c
				break
			}
		}
		src, err := blockSource(b, m)
		if err != nil {
			return fmt.Sprintf("%s:%d: %v", b.file, b.line, err), err
		}
		pkg := fmt.Sprintf("readmecheck/b%02d", i)
		backing := filepath.Join(tmp, fmt.Sprintf("b%02d.go", i))
		require.NoError(t, os.WriteFile(backing, src, 0o600))
		overlay[filepath.Join(root, m.dir, pkg, "block.go")] = backing
		if !strings.HasPrefix(strings.TrimSpace(b.code), "package ") && !strings.Contains(b.code, "\npackage ") {
			pre := filepath.Join(tmp, fmt.Sprintf("b%02d_prelude.go", i))
			require.NoError(t, os.WriteFile(pre, preludeSource(m), 0o600))
			overlay[filepath.Join(root, m.dir, pkg, "prelude.go")] = pre
		}
		byModule[m.dir] = append(byModule[m.dir], "./"+pkg)
	}
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	require.NoError(t, err)
	overlayFile := filepath.Join(tmp, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, js, 0o600))

	var all bytes.Buffer
	var firstErr error
	dirs := make([]string, 0, len(byModule))
	for d := range byModule {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		cmd := exec.CommandContext(t.Context(), "go", append([]string{"build", "-overlay", overlayFile}, byModule[d]...)...)
		cmd.Dir = filepath.Join(root, d)
		out, err := cmd.CombinedOutput()
		t.Logf("go build in %s: %d block(s)", d, len(byModule[d]))
		all.Write(out)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("go build in %s: %w", d, err)
		}
	}
	return all.String(), firstErr
}

// isProgram reports whether code is a whole file (it has a package clause).
func isProgram(code string) bool {
	f, err := parser.ParseFile(token.NewFileSet(), "", code, parser.PackageClauseOnly)
	return err == nil && f.Name != nil
}

// blockSource returns the Go file of block b: a program as it is, a
// fragment as the body of a function, with the imports it names and a use
// of each variable it declares (an excerpt need not use its own results).
func blockSource(b goBlock, m readmeModule) ([]byte, error) {
	directive := fmt.Sprintf("//line %s:%d\n", b.file, b.line)
	if isProgram(b.code) {
		return []byte(directive + b.code), nil
	}
	body := "package readme\n\nfunc _() {\n" + directive + b.code + "}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", body, 0)
	if err != nil {
		return nil, err
	}
	fn := f.Decls[0].(*ast.FuncDecl)
	var declared []string
	for _, st := range fn.Body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
						declared = append(declared, id.Name)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := st.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, sp := range g.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						declared = append(declared, id.Name)
					}
				}
			}
		}
	}
	imports := map[string]bool{}
	ast.Inspect(fn, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
				if path, ok := readmePackages[id.Name]; ok {
					imports[fmt.Sprintf("%s %q", id.Name, path)] = true
				}
			}
		}
		return true
	})
	var src strings.Builder
	src.WriteString("package readme\n\nimport (\n")
	for _, imp := range sortedKeys(imports) {
		src.WriteString("\t" + imp + "\n")
	}
	src.WriteString(")\n\nfunc _() {\n" + directive + b.code)
	for _, name := range declared {
		src.WriteString("\t_ = " + name + "\n")
	}
	src.WriteString("}\n")
	return []byte(src.String()), nil
}

// preludeSource returns the file declaring what m's fragments share.
func preludeSource(m readmeModule) []byte {
	imports := append(append([]string(nil), readmePreludeImports...), m.imports...)
	return []byte("package readme\n\nimport (\n\t" + strings.Join(imports, "\n\t") + "\n)\n" + readmePrelude + m.prelude)
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
