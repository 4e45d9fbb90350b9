package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The documents whose commands TestDocsNameRealCommandsAndFlags checks, relative to the
// repository root: the README, every page under docs/, the deploy notes and the benchmarks.
var docGlobs = []string{"README.md", "BENCHMARKS.md", "deploy/README.md", "docs/*.md", "docs/*/*.md", "docs/*/*/*.md"}

// refusedOnPurpose are command lines the documents show because atoll refuses them (the
// bad input of docs/hardening.md).
var refusedOnPurpose = map[string]bool{"atoll bench nosuch": true}

// TestDocsNameRealCommandsAndFlags reads every `atoll ...` command line the documents show
// (in code spans and fenced code blocks, also as ./atoll and go run ./cmd/atoll), resolves
// its command path through the CLI's own command tree (newRootCmd, nothing is run) and
// checks that each --flag it names is defined on that command, locally or inherited. A
// code span that is a bare --flag must be a flag of some atoll command.
func TestDocsNameRealCommandsAndFlags(t *testing.T) {
	root := docsRoot()
	files := docFiles(t)
	if len(files) < 5 {
		t.Fatalf("found only %d documents (%v): run from cmd/atoll", len(files), files)
	}
	commands := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(filepath.Join("..", ".."), f)
		uses, bare := scanDoc(rel, string(b))
		commands += len(uses)
		for _, u := range uses {
			if refusedOnPurpose[u.Text] {
				if len(checkDocCommand(root, u)) == 0 {
					t.Errorf("%s:%d: `%s` is shown as refused, and atoll takes it", u.File, u.Line, u.Text)
				}
				continue
			}
			for _, p := range checkDocCommand(root, u) {
				t.Error(p)
			}
		}
		for _, u := range bare {
			if !someCommandHas(root, u.Args[0]) {
				t.Errorf("%s:%d: `%s`: no atoll command has the flag %s", u.File, u.Line, u.Text, u.Args[0])
			}
		}
	}
	if commands < 50 {
		t.Errorf("found only %d atoll command lines in %d documents: is the scanner broken?", commands, len(files))
	}
	t.Logf("%d atoll command lines checked in %d documents", commands, len(files))
}

// TestDocsScanner checks the scanner on small documents: a fake flag or command must be
// reported with its file and line; what is not an atoll command line must not be.
func TestDocsScanner(t *testing.T) {
	root := docsRoot()
	cases := []struct {
		name, doc string
		want      []string // substrings of the one problem expected (none: no problem)
	}{
		{"real", "Run `atoll up --dir c --agents 4` then\n\n```sh\n./atoll status --dir ./c --json   # --nosuch in a comment\n```\n", nil},
		{"fake flag in a span", "text\nthen `atoll demo --dir c --fake-flag 3`.\n", []string{"x.md:2: ", `"atoll demo" has no flag --fake-flag`}},
		{"fake flag in a block", "```sh\ngo build -o atoll ./cmd/atoll\n./atoll up --dir c \\\n    --nosuch\n```\n", []string{"x.md:3: ", `"atoll up" has no flag --nosuch`}},
		{"go run", "```\ngo run ./cmd/atoll demo --scenario preempt --bogus\n```\n", []string{"x.md:2: ", "--bogus"}},
		{"inherited help, short flags", "`atoll bench sched -h`, `atoll help up`, `atoll demo --help`\n", nil},
		{"unknown command", "`atoll bench nosuch --json`\n", []string{"x.md:1: ", `"atoll bench" has no command "nosuch"`}},
		{"unknown top-level command", "```\nATOLL_TOKEN=s atoll frobnicate\n```\n", []string{"x.md:2: ", `no command "frobnicate"`}},
		{"placeholders", "`atoll logs JOB [--gang G] [--rank N] [--follow]`, `atoll queues [--set FILE]`, `atoll bench <name>`\n", nil},
		{"span across lines", "a (`atoll dashboard\n  --tokn`) b\n", []string{"x.md:1: ", "--tokn"}},
		{"bad flag after a positional", "`atoll logs digits --rank 3 --rnak 3`\n", []string{"--rnak"}},
		{"bad short flag", "`atoll logs digits -x`\n", []string{`"atoll logs" has no flag -x`}},
		{"after --", "`atoll submit --dir c --wait -- ./digits --anything`\n", nil},
		{"not commands", "`cmd/atoll TestX`, `atoll_gpus_total`, `atoll-benchmeta --x`, \"atoll dashboard v1\", `go build -o atoll ./cmd/atoll`\n", nil},
		{"two commands on one line", "```\n./atoll up --dir c && ./atoll down --dir c --now\n```\n", []string{"x.md:2: ", `"atoll down" has no flag --now`}},
		{"command substitution", "```\nATOLL_ADDRESS=$(./atoll address --dir c --bad) go run ./examples/digits\n```\n", []string{"--bad"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			uses, _ := scanDoc("x.md", c.doc)
			var got []string
			for _, u := range uses {
				got = append(got, checkDocCommand(root, u)...)
			}
			if len(c.want) == 0 {
				if len(got) > 0 {
					t.Fatalf("reported %q, want nothing", got)
				}
				if len(uses) == 0 && c.name != "not commands" {
					t.Fatalf("found no command in %q", c.doc)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("reported %q, want one problem with %q", got, c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("reported %q, want it to contain %q", got[0], w)
				}
			}
		})
	}
	_, bare := scanDoc("x.md", "the flag `--dir`, and `--no-such-flag-anywhere`; `-race` is go's\n")
	var missing []string
	for _, b := range bare {
		if !someCommandHas(root, b.Args[0]) {
			missing = append(missing, b.Args[0])
		}
	}
	if !slices.Equal(missing, []string{"--no-such-flag-anywhere"}) {
		t.Errorf("bare flags missing: %q, want [--no-such-flag-anywhere]", missing)
	}
}

// docsRoot is the CLI's command tree as Execute completes it (help and completion).
func docsRoot() *cobra.Command {
	root := newRootCmd()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	return root
}

func docFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, g := range docGlobs {
		m, err := filepath.Glob(filepath.Join("..", "..", g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return files
}

// someCommandHas reports whether any command of the tree has the flag ("--name").
func someCommandHas(c *cobra.Command, flag string) bool {
	name := strings.TrimPrefix(flag, "--")
	if name == "help" || c.LocalFlags().Lookup(name) != nil {
		return true
	}
	return slices.ContainsFunc(c.Commands(), func(s *cobra.Command) bool { return someCommandHas(s, flag) })
}

// docCommand is an atoll command line found in a document: Args follow "atoll".
type docCommand struct {
	File string
	Line int
	Text string
	Args []string
}

// scanDoc finds the atoll command lines of a markdown document, in fenced code blocks
// (a line, with its backslash continuations) and in code spans (which may run over a
// line break). bare are the code spans that are a lone --flag (Args[0]).
func scanDoc(file, doc string) (uses, bare []docCommand) {
	lines := strings.Split(doc, "\n")
	prose := make([]string, len(lines)) // the document without its fenced blocks
	fence := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		trim := strings.TrimSpace(l)
		if fence == "" {
			if strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~") {
				fence = trim[:3]
				continue
			}
			prose[i] = l
			continue
		}
		if strings.HasPrefix(trim, fence) {
			fence = ""
			continue
		}
		start := i
		text := l
		for strings.HasSuffix(strings.TrimRight(text, " \t"), `\`) && i+1 < len(lines) {
			text = strings.TrimSuffix(strings.TrimRight(text, " \t"), `\`) + " " + lines[i+1]
			i++
		}
		for _, args := range commandLines(text) {
			uses = append(uses, docCommand{File: file, Line: start + 1, Text: strings.TrimSpace(text), Args: args})
		}
	}
	text := strings.Join(prose, "\n")
	for pos := 0; pos < len(text); {
		open := strings.IndexByte(text[pos:], '`')
		if open < 0 {
			break
		}
		open += pos
		n := 0
		for open+n < len(text) && text[open+n] == '`' {
			n++
		}
		ticks := text[open : open+n]
		end := -1
		for from := open + n; from < len(text); {
			j := strings.Index(text[from:], ticks)
			if j < 0 {
				break
			}
			j += from
			k := j + n
			for k < len(text) && text[k] == '`' {
				k++
			}
			if k == j+n {
				end = j
				break
			}
			from = k
		}
		if end < 0 {
			pos = open + n
			continue
		}
		span := text[open+n : end]
		pos = end + n
		if strings.Contains(span, "\n\n") { // not a span: an unmatched backtick
			pos = open + n
			continue
		}
		line := strings.Count(text[:open], "\n") + 1
		flat := strings.Join(strings.Fields(span), " ")
		if m := bareFlag.FindStringSubmatch(flat); m != nil {
			bare = append(bare, docCommand{File: file, Line: line, Text: flat, Args: []string{m[1]}})
			continue
		}
		for _, args := range commandLines(flat) {
			uses = append(uses, docCommand{File: file, Line: line, Text: flat, Args: args})
		}
	}
	return uses, bare
}

var (
	// bareFlag is a code span that names one long flag, with or without a value.
	bareFlag = regexp.MustCompile(`^(--[a-z0-9][a-z0-9-]*)(?:[ =]\S+)?$`)
	// segmentSep splits a shell line where a new command may start.
	segmentSep = regexp.MustCompile("&&|\\|\\||[;|`()]|\\$\\(")
	// envAssign is an environment assignment before a command.
	envAssign = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	// atollPath is how the documents run the CLI: atoll, ./atoll, /atoll, a path that
	// starts with ./ or /, or deploy/atoll (not cmd/atoll, which names the package).
	atollPath = regexp.MustCompile(`^(?:atoll|deploy/atoll|\.?/(?:[\w.-]+/)*atoll)$`)
)

// commandLines returns the arguments of every atoll command in one line of shell: a
// command starts a segment of the line (after &&, ;, |, $( or an opening parenthesis),
// after any environment assignments, as atoll, ./atoll or go run ./cmd/atoll.
func commandLines(line string) [][]string {
	var out [][]string
	for _, seg := range segmentSep.Split(line, -1) {
		f := strings.Fields(seg)
		i := 0
		for i < len(f) && (envAssign.MatchString(f[i]) || f[i] == "$" || f[i] == "exec" || f[i] == "sudo" || f[i] == "time") {
			i++
		}
		if i+1 < len(f) && f[i] == "go" && f[i+1] == "run" {
			i += 2
			for i < len(f) && strings.HasPrefix(f[i], "-") {
				if f[i] == "-tags" {
					i++
				}
				i++
			}
			if i >= len(f) || f[i] != "./cmd/atoll" {
				continue
			}
		} else if i >= len(f) || !atollPath.MatchString(f[i]) {
			continue
		}
		var args []string
		for _, a := range f[i+1:] {
			if strings.HasPrefix(a, "#") || a == ">" || a == "<" || strings.HasPrefix(a, "2>") || strings.HasPrefix(a, ">") {
				break
			}
			args = append(args, a)
		}
		out = append(out, args)
	}
	return out
}

// placeholder reports whether a positional argument stands for something (JOB, <cmd>,
// ..., DIR) rather than naming a command.
func placeholder(a string) bool {
	return a == "" || strings.HasPrefix(a, "<") || strings.Contains(a, "...") || strings.ToUpper(a) == a
}

// cleanArg drops the brackets and punctuation that documents put around arguments
// ([--json], (--dir D), --rank N]).
func cleanArg(a string) string {
	return strings.Trim(a, "[](),.:")
}

var flagName = regexp.MustCompile(`^(--?)([A-Za-z0-9][A-Za-z0-9_-]*)(=.*)?$`)

// checkDocCommand resolves a command line through the command tree and returns its
// problems: a command that does not exist, or a flag its command does not have.
func checkDocCommand(root *cobra.Command, u docCommand) []string {
	var clean []string
	for _, a := range u.Args {
		if a == "--" {
			break
		}
		if a = cleanArg(a); a != "" {
			clean = append(clean, a)
		}
	}
	cmd, rest, err := root.Find(clean)
	if err != nil {
		return []string{fmt.Sprintf("%s:%d: `%s`: %v", u.File, u.Line, u.Text, err)}
	}
	cmd.InitDefaultHelpFlag()
	where := fmt.Sprintf("%s:%d: `%s`: ", u.File, u.Line, u.Text)
	var problems []string
	positional := false
	for i := 0; i < len(clean); i++ {
		a := clean[i]
		m := flagName.FindStringSubmatch(a)
		if m == nil || !strings.HasPrefix(a, "-") {
			if !positional && cmd.HasSubCommands() && slices.Contains(rest, a) && !placeholder(a) {
				// Its flags would be checked against the wrong command.
				return append(problems, fmt.Sprintf("%scommand %q has no command %q", where, cmd.CommandPath(), a))
			}
			if slices.Contains(rest, a) {
				positional = true
			}
			continue
		}
		if m[1] == "-" && len(m[2]) > 1 {
			continue // -race and the like: not atoll's
		}
		f := cmd.Flag(m[2])
		if m[1] == "-" {
			if f = cmd.Flags().ShorthandLookup(m[2]); f == nil {
				f = cmd.InheritedFlags().ShorthandLookup(m[2])
			}
		}
		if f == nil {
			problems = append(problems, fmt.Sprintf("%scommand %q has no flag %s", where, cmd.CommandPath(), m[1]+m[2]))
			continue
		}
		if m[3] == "" && f.NoOptDefVal == "" && i+1 < len(clean) {
			i++ // its value
		}
	}
	return problems
}
