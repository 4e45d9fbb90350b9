package sdk

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// publicAtoll are the Atoll packages a program may import, which the SDK's exported API
// may therefore name.
var publicAtoll = map[string]bool{
	"github.com/atoll-run/atoll/sdk":      true,
	"github.com/atoll-run/atoll/topology": true,
}

// exemptFuncs take a parameter of an internal type on purpose.
var exemptFuncs = map[string]bool{
	"WithEmbedded": true, // its Starter is implemented by sdk/local only
	// A hollow agent's launcher calls them (atoll bench scale's WorkerHost): a program
	// never does.
	"HostsWorker": true,
	"HostWorker":  true,
}

// untypedConsts re-export another package's untyped constants (the parser cannot tell them
// from typed ones).
var untypedConsts = map[string]bool{
	"ExitPermanent": true, // an exit status: an int
}

// TestTypesNoInternalInAPI parses the SDK's sources and fails when an exported type is an
// alias of another package's type, or when an exported type, field, function, method or
// constant names a type of an Atoll package a program cannot import (runtime/api,
// store/meta, ...): the program could not name what it is handed.
func TestTypesNoInternalInAPI(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		internal := internalImports(t, f)
		report := func(what string, n ast.Node) {
			for _, sel := range internalSelectors(n, internal) {
				t.Errorf("%s: %s names %s (an internal package's type: define an SDK type)", fset.Position(n.Pos()), what, sel)
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || exemptFuncs[d.Name.Name] {
					continue
				}
				if d.Recv != nil {
					if !exportedRecv(d.Recv.List[0].Type) {
						continue
					}
					report("method "+d.Name.Name, d.Recv)
				}
				report("func "+d.Name.Name, d.Type)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						if s.Assign.IsValid() {
							if _, local := s.Type.(*ast.Ident); !local {
								t.Errorf("%s: type %s is an alias of %s: define an SDK type", fset.Position(s.Pos()), s.Name.Name, exprString(s.Type))
							}
						}
						report("type "+s.Name.Name, exportedParts(s.Type))
					case *ast.ValueSpec:
						if d.Tok != token.CONST {
							continue // the ErrX sentinels re-exported from other packages are values
						}
						for i, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							if s.Type != nil {
								report("const "+n.Name, s.Type)
							} else if i < len(s.Values) && !untypedConsts[n.Name] {
								if _, bare := s.Values[i].(*ast.SelectorExpr); bare {
									report("const "+n.Name, s.Values[i]) // untyped: it has the other package's type
								}
							}
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source file checked")
	}
}

// internalImports maps a file's import names to whether they are Atoll packages a program
// cannot import.
func internalImports(t *testing.T, f *ast.File) map[string]bool {
	out := map[string]bool{}
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			t.Fatal(err)
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		out[name] = strings.HasPrefix(path, "github.com/atoll-run/atoll/") && !publicAtoll[path]
	}
	return out
}

// internalSelectors lists the pkg.Name expressions under n whose pkg is internal.
func internalSelectors(n ast.Node, internal map[string]bool) []string {
	var out []string
	ast.Inspect(n, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] {
				out = append(out, id.Name+"."+sel.Sel.Name)
			}
		}
		return true
	})
	return out
}

// exportedParts is a type expression without its unexported struct fields and interface
// methods (a program reaches neither).
func exportedParts(e ast.Expr) ast.Node {
	keep := func(fl *ast.FieldList) *ast.FieldList {
		out := &ast.FieldList{}
		for _, f := range fl.List {
			exported := len(f.Names) == 0 && exportedRecv(f.Type) // embedded: named by its type
			for _, n := range f.Names {
				exported = exported || n.IsExported()
			}
			if exported {
				out.List = append(out.List, f)
			}
		}
		return out
	}
	switch t := e.(type) {
	case *ast.StructType:
		return keep(t.Fields)
	case *ast.InterfaceType:
		return keep(t.Methods)
	}
	return e
}

// exportedRecv reports whether a receiver's (or an embedded field's) type name is exported.
func exportedRecv(e ast.Expr) bool {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.IsExported()
		case *ast.SelectorExpr:
			return t.Sel.IsExported()
		default:
			return true
		}
	}
}

func exprString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return "*" + exprString(t.X)
	case *ast.SelectorExpr:
		return exprString(t.X) + "." + t.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}

// TestTypesCarryEveryField fills every field of the cluster API's records with a value
// that is not zero, converts them to the SDK's types and checks that both print the same
// JSON (so a field the SDK misses, or a field added to the records later, fails here), and
// that the SDK's JSON reads back to the same value.
func TestTypesCarryEveryField(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, fill bool)
	}{
		{"Status", carried(fromAPIStatus)},
		{"Machine", carried(fromAPIMachine)},
		{"Placement", carried(fromAPIPlacement)},
		{"Member", carried(fromAPIMember)},
		{"WorkerInfo", carried(fromAPIWorker)},
		{"EvictionCosts", carried(fromAPIEvictionCosts)},
		{"NoticeStatus", carried(fromAPINotice)},
		{"PoolMachine", carried(fromAPIPoolMachine)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, true) })
		t.Run(tt.name+"/zero", func(t *testing.T) { tt.run(t, false) })
	}
}

// carried checks a conversion: the same JSON from the record and from its SDK value.
func carried[A, S any](conv func(A) S) func(t *testing.T, fill bool) {
	return func(t *testing.T, fill bool) {
		var in A
		if fill {
			n := 0
			fillValue(reflect.ValueOf(&in).Elem(), &n)
		}
		want, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(conv(in))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("the SDK's JSON differs from the record's:\n got %s\nwant %s", got, want)
		}
		var back S
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		again, err := json.Marshal(back)
		if err != nil {
			t.Fatal(err)
		}
		if string(again) != string(want) {
			t.Fatalf("the SDK's JSON reads back differently:\n got %s\nwant %s", again, want)
		}
	}
}

// fillValue sets every settable part of v to a value that is not zero, each a different
// one (counted by n): slices and maps get two elements, pointers a filled value.
func fillValue(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillValue(p.Elem(), n)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fillValue(s.Index(i), n)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fillValue(k, n)
			fillValue(e, n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2025, 1, 2, 3, 4, 5, *n, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillValue(v.Field(i), n)
			}
		}
	}
}

// TestTypesNotice checks the driver's notice carries the record's kind and costs.
func TestTypesNotice(t *testing.T) {
	costs := &api.EvictionCosts{WorkLost: 1, Checkpoint: 2, Restore: 3, CUDAContext: 4, Communicator: 5, GPUSeconds: 6}
	for _, kind := range []struct {
		rec api.NoticeKind
		sdk NoticeKind
	}{{api.NoticePreempt, NoticePreempt}, {api.NoticeDrain, NoticeDrain}, {api.NoticeShrink, NoticeShrink}, {api.NoticeGrow, NoticeGrow}} {
		n := noticeOf(api.Gang{Notice: &api.Notice{Kind: kind.rec, Costs: costs}})
		if n.Kind != kind.sdk {
			t.Errorf("kind %q: got %q", kind.rec, n.Kind)
		}
		if n.Costs == nil || *n.Costs != (EvictionCosts{1, 2, 3, 4, 5, 6}) {
			t.Errorf("kind %q: costs %+v", kind.rec, n.Costs)
		}
	}
}

// TestTypesGangState checks the SDK's gang states are the records' (Gang.State converts).
func TestTypesGangState(t *testing.T) {
	for _, s := range []struct {
		rec api.GangState
		sdk GangState
	}{{api.GangPending, GangPending}, {api.GangStarting, GangStarting}, {api.GangRunning, GangRunning},
		{api.GangRestarting, GangRestarting}, {api.GangFailed, GangFailed}, {api.GangStopped, GangStopped}} {
		if got := (&Gang{rec: api.Gang{State: s.rec}}).State(); got != s.sdk {
			t.Errorf("state %q: got %q, want %q", s.rec, got, s.sdk)
		}
	}
}
