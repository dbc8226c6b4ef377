from burstsched.cli import main

raise SystemExit(main())
