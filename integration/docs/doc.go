// Package docs tests the project's documents as a reader uses them: the
// shell examples of README.md and docs/GUIDE.md run as written, from a
// copy of the checkout with vlink installed as the README says
// (TestReadmeExamples), and every relative link and #anchor of the
// Markdown files leads somewhere (TestDocLinks).
//
// The package has no API; everything is in its tests. The examples need
// root (a network namespace of their own, so that their fixed ports meet
// nothing else) and the programs they call; without them the test skips,
// except in CI (CI=true), where it fails.
package docs
