package ddptrain

// SetJoinFault makes a joined rank's shadowed step fail where f returns
// an error (nil: no fault). Set it before the ranks start.
func SetJoinFault(f func(rank int, step uint64) error) { joinFault = f }
