from turingbox.cli import main

raise SystemExit(main())
