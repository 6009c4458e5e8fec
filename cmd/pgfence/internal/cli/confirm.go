package cli

import (
	"bufio"
	"fmt"
	"strings"
)

// confirm asks question on standard error and reads the answer from
// standard input. It returns nil when yes is set or the user answers y or
// yes; errAborted on any other answer; and a usage error, without asking,
// when standard input is not a terminal.
func (a *App) confirm(question string, yes bool) error {
	if yes {
		return nil
	}
	if a.StdinIsTerminal == nil || !a.StdinIsTerminal() {
		return usageErrorf("refusing without confirmation: standard input is not a terminal; pass --yes to confirm")
	}
	fmt.Fprintf(a.Stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(a.Stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	default:
		return errAborted
	}
}
