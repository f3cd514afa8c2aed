package vlink

// RaceStagger is raceStagger, for the best-effort tests of package vlink_test.
const RaceStagger = raceStagger
