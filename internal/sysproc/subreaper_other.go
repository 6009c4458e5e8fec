//go:build !linux

package sysproc

import "errors"

// SetChildSubreaper fails where the kernel has no child subreapers.
func SetChildSubreaper() error { return errors.ErrUnsupported }
