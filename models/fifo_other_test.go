//go:build !unix

package models

import "errors"

func mkfifo(string) error { return errors.New("no FIFOs here") }
