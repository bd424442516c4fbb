%%% @doc The shared-memory side channel under attack and under failure: an
%%% unpredictable private directory that is never adopted, private files,
%%% clean-up when the caller is killed mid-call, a safe sweep, and the pipe
%%% when /dev/shm is full, read-only or unusable.
-module(kem_shm_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("kernel/include/file.hrl").

-define(DOUBLE, <<"double">>).

%%% the directory, without the app

dir_test_() ->
    {setup, fun scratch_root/0, fun(Root) -> file:del_dir_r(Root) end,
     fun(Root) ->
         [fun() -> fresh_dirs_are_private_and_unpredictable(Root) end,
          fun() -> squatted_names_are_never_adopted(Root) end,
          fun() -> sweep_removes_only_provably_dead_dirs_of_ours(Root) end]
     end}.

scratch_root() ->
    Root = filename:join("/tmp", "kem_shm_tests_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Root, "x")),
    Root.

mode(Path) ->
    {ok, #file_info{mode = Mode}} = file:read_link_info(Path),
    Mode band 8#777.

fresh_dirs_are_private_and_unpredictable(Root) ->
    {ok, A} = kem_shm_dir:create(Root),
    {ok, B} = kem_shm_dir:create(Root),
    ?assertNotEqual(A, B),
    ?assertEqual(nomatch, string:find(filename:basename(A), os:getpid())),
    ?assert(length(filename:basename(A)) >= 4 + 32),
    ?assertEqual(8#700, mode(A)),
    ?assertEqual(8#600, mode(filename:join(A, "owner"))),
    {ok, Uid} = kem_shm_dir:own_uid(),
    {ok, #file_info{uid = Owner}} = file:read_link_info(A),
    ?assertEqual(Uid, Owner).

squatted_names_are_never_adopted(Root) ->
    {ok, Uid} = kem_shm_dir:own_uid(),
    {ok, Start} = kem_shm_dir:own_start(),
    %% A directory planted at the name, with a link to redirect writes.
    Planted = filename:join(Root, "kem-planted"),
    Target = filename:join(Root, "target"),
    ok = file:make_dir(Planted),
    ok = file:change_mode(Planted, 8#777),
    ok = file:make_dir(Target),
    ok = file:make_symlink(Target, filename:join(Planted, "1.in")),
    ?assertMatch({error, {exists, _}}, kem_shm_dir:make(Planted, Uid, Start)),
    ?assertEqual(8#777, mode(Planted)),
    ?assertEqual({ok, ["1.in"]}, file:list_dir(Planted)),
    %% A symlink planted at the name.
    Link = filename:join(Root, "kem-link"),
    ok = file:make_symlink(Target, Link),
    ?assertMatch({error, {exists, _}}, kem_shm_dir:make(Link, Uid, Start)),
    ?assertEqual({ok, []}, file:list_dir(Target)),
    %% An input file name taken by a link is refused, not written through.
    {ok, Dir} = kem_shm_dir:create(Root),
    Victim = filename:join(Target, "victim"),
    ok = file:make_symlink(Victim, filename:join(Dir, "7.in")),
    ?assertMatch({error, eexist}, kem_shm_dir:write_private(filename:join(Dir, "7.in"), <<"data">>)),
    ?assertNot(filelib:is_file(Victim)).

sweep_removes_only_provably_dead_dirs_of_ours(Root) ->
    {ok, Uid} = kem_shm_dir:own_uid(),
    {ok, Start} = kem_shm_dir:own_start(),
    Sub = filename:join(Root, "sweep"),
    ok = filelib:ensure_dir(filename:join(Sub, "x")),
    Dead = dead_node_dir(Sub, "kem-dead"),
    Open = dead_node_dir(Sub, "kem-open"),
    ok = file:change_mode(Open, 8#755),  % not private: not provably ours
    NoMarker = filename:join(Sub, "kem-nomarker"),
    ok = file:make_dir(NoMarker),
    ok = file:change_mode(NoMarker, 8#700),
    {ok, Live} = kem_shm_dir:make(filename:join(Sub, "kem-live"), Uid, Start),
    Elsewhere = dead_node_dir(Root, "elsewhere"),
    ok = file:make_symlink(Elsewhere, filename:join(Sub, "kem-link")),
    ?assertEqual(1, kem_shm_dir:sweep(Sub, Uid)),
    ?assertNot(filelib:is_dir(Dead)),
    [?assert(filelib:is_dir(D)) || D <- [Open, NoMarker, Live, Elsewhere]],
    %% Another user's directory, even with a dead node's marker, stays.
    Other = dead_node_dir(Sub, "kem-other"),
    ?assertEqual(0, kem_shm_dir:sweep(Sub, Uid + 1)),
    ?assert(filelib:is_dir(Other)).

%% A directory as a node that has exited would leave it: private, with an
%% owner file naming a process that is gone.
dead_node_dir(Parent, Name) ->
    Dir = filename:join(Parent, Name),
    ok = file:make_dir(Dir),
    ok = file:change_mode(Dir, 8#700),
    Marker = filename:join(Dir, "owner"),
    ok = kem_shm_dir:write_private(Marker, <<"999999999 12345\n">>),
    ok = file:write_file(filename:join(Dir, "1.in"), <<"left behind">>),
    Dir.

%%% with the app

app_test_() ->
    {setup, fun() -> start([{port_env, [{"KEM_TEST_HOOKS", "1"}]}]) end, fun stop/1,
     [{timeout, 60, fun files_are_private_and_gone_when_the_caller_is_killed/0}]}.

start(Env) -> kem_test_app:start(Env).

stop(Apps) -> kem_test_app:stop(Apps).

payload_files() ->
    {ok, Files} = file:list_dir(kem_shm_dir:path()),
    lists:sort(Files -- ["owner"]).

files_are_private_and_gone_when_the_caller_is_killed() ->
    [Port] = kem_sup:port_names(),
    Dir = kem_shm_dir:path(),
    ?assertEqual(8#700, mode(Dir)),
    %% Hold the GPU thread so the large call waits on the port, files made.
    Holder = spawn(fun() -> kem:call(test_hook, {sleep_gpu, 1500}, 10000) end),
    Big = crypto:strong_rand_bytes(4 bsl 20),
    Caller = spawn(fun() -> kem:execute(?DOUBLE, Big, #{output_size => 8}) end),
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) >= 2 end, 5000),
    [In] = payload_files(),
    ?assertEqual(".in", filename:extension(In)),
    ?assertEqual(8#600, mode(filename:join(Dir, In))),
    exit(Caller, kill),
    %% The port answers after the hold, to nobody; the files go anyway.
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) =:= 0 end, 10000),
    ?assertEqual(ok, wait_until(fun() -> payload_files() =:= [] end, 2000)),
    ?assertNot(is_process_alive(Holder)).

wait_until(Cond, Left) when Left =< 0 ->
    {timeout, Cond()};
wait_until(Cond, Left) ->
    case Cond() of
        true -> ok;
        false -> timer:sleep(10), wait_until(Cond, Left - 10)
    end.

%%% kept part files (kem_shm_slots), with a threshold low enough to test

-define(SLOT_MIN, (2 bsl 20)).

slots_test_() ->
    {setup,
     fun() -> start([{port_env, [{"KEM_TEST_HOOKS", "1"}]}, {shm_slot_threshold, ?SLOT_MIN},
                     {shm_slots, 2}, {shm_slot_idle_ms, 3000}]) end,
     fun stop/1,
     [{timeout, 60, fun slot_payloads_match_and_their_files_are_kept/0},
      {timeout, 60, fun idle_slot_files_are_deleted/0},
      {timeout, 60, fun more_callers_than_slots_all_get_their_results/0},
      {timeout, 60, fun a_planted_link_in_a_slot_is_never_written_through/0},
      {timeout, 60, fun slot_files_are_gone_when_the_caller_is_killed/0},
      {timeout, 60, fun kept_files_go_when_the_port_is_lost/0}]}.

inode(Path) ->
    {ok, #file_info{inode = Inode}} = file:read_link_info(Path),
    Inode.

slot_payloads_match_and_their_files_are_kept() ->
    Dir = kem_shm_dir:path(),
    %% Sizes that are not multiples of 4 nor of a part; results smaller and
    %% larger than the input; the slot's files are kept and written over.
    Cases = [{?SLOT_MIN + 3, ?SLOT_MIN + 3}, {5 * ?SLOT_MIN + 1, 5 * ?SLOT_MIN + 6},
             {?SLOT_MIN + 3, 7}, {3 * ?SLOT_MIN, 0}],
    Inodes = [begin
                  Input = crypto:strong_rand_bytes(Size),
                  ?assertEqual({ok, kem_ref:double_ref(Input, Out)},
                               kem:execute(?DOUBLE, Input, #{output_size => Out})),
                  ?assertEqual(16, length(payload_files())),
                  inode(filename:join(Dir, "slot1.in.0"))
              end || {Size, Out} <- Cases],
    ?assertEqual(1, length(lists:usort(Inodes))),
    %% The kernel methods take the same way.
    Input = crypto:strong_rand_bytes(?SLOT_MIN + 1),
    ?assertEqual(kem_ref:double_ref(Input, 2 * (?SLOT_MIN + 1)), kem_nif:execute_kernel(?DOUBLE, Input, 2)).

idle_slot_files_are_deleted() ->
    Input = crypto:strong_rand_bytes(?SLOT_MIN),
    {ok, _} = kem:execute(?DOUBLE, Input, #{output_size => 4}),
    ?assertNotEqual([], payload_files()),
    ?assertEqual(ok, wait_until(fun() -> payload_files() =:= [] end, 8000)).

more_callers_than_slots_all_get_their_results() ->
    Parent = self(),
    Inputs = [crypto:strong_rand_bytes(?SLOT_MIN + K) || K <- lists:seq(1, 5)],
    Pids = [spawn_link(fun() -> Parent ! {self(), kem:execute(?DOUBLE, I, #{})} end) || I <- Inputs],
    [?assertEqual({ok, kem_ref:double_ref(I, byte_size(I))}, receive {Pid, R} -> R end)
     || {Pid, I} <- lists:zip(Pids, Inputs)],
    %% One-off files of the callers that found no slot are gone.
    ?assertEqual([], [F || F <- payload_files(), not lists:prefix("slot", F)]).

a_planted_link_in_a_slot_is_never_written_through() ->
    Dir = kem_shm_dir:path(),
    ok = wait_until(fun() -> payload_files() =:= [] end, 8000),
    Victim = filename:join("/tmp", "kem_shm_victim_" ++ os:getpid()),
    ok = file:write_file(Victim, <<"keep me">>),
    ok = file:make_symlink(Victim, filename:join(Dir, "slot1.in.3")),
    Input = crypto:strong_rand_bytes(?SLOT_MIN + 5),
    ?assertEqual({ok, kem_ref:double_ref(Input, 9)}, kem:execute(?DOUBLE, Input, #{output_size => 9})),
    ?assertEqual({ok, <<"keep me">>}, file:read_file(Victim)),
    ?assertEqual([], payload_files()),  % the slot was emptied, the link too
    ok = file:delete(Victim).

slot_files_are_gone_when_the_caller_is_killed() ->
    [Port] = kem_sup:port_names(),
    ok = wait_until(fun() -> payload_files() =:= [] end, 8000),
    Holder = spawn(fun() -> kem:call(test_hook, {sleep_gpu, 1500}, 10000) end),
    Big = crypto:strong_rand_bytes(?SLOT_MIN + 7),
    Caller = spawn(fun() -> kem:execute(?DOUBLE, Big, #{output_size => 8}) end),
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) >= 2 end, 5000),
    ?assertEqual(8, length(payload_files())),
    [?assertEqual(8#600, mode(filename:join(kem_shm_dir:path(), F))) || F <- payload_files()],
    exit(Caller, kill),
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) =:= 0 end, 10000),
    ?assertEqual(ok, wait_until(fun() -> payload_files() =:= [] end, 2000)),
    ?assertNot(is_process_alive(Holder)).

%% A slot kept from an earlier call and the slot of a call in flight are
%% both emptied when the port is lost; the next call is right again.
kept_files_go_when_the_port_is_lost() ->
    [Port] = kem_sup:port_names(),
    Parent = self(),
    %% Two calls held on the port together: both slots taken, then kept.
    %% 3 s: both calls must reach the port while the hook holds the GPU
    %% (a call answered first would free its slot for the other).
    Holder = spawn(fun() -> kem:call(test_hook, {sleep_gpu, 3000}, 10000) end),
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) >= 1 end, 5000),
    Kept = [crypto:strong_rand_bytes(?SLOT_MIN + K) || K <- [1, 2]],
    [spawn(fun() -> Parent ! {kept, I, kem:execute(?DOUBLE, I, #{output_size => 5})} end) || I <- Kept],
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) >= 3 end, 5000),
    [receive {kept, I, R} -> ?assertEqual({ok, kem_ref:double_ref(I, 5)}, R) end || I <- Kept],
    ?assertEqual(32, length(payload_files())),
    ?assertNot(is_process_alive(Holder)),
    %% A third call in flight (in slot 1) when the port is lost.
    _ = spawn(fun() -> kem:call(test_hook, {sleep_gpu, 3000}, 10000) end),
    Big = crypto:strong_rand_bytes(?SLOT_MIN + 3),
    _ = spawn(fun() -> Parent ! {lost, kem:execute(?DOUBLE, Big, #{output_size => 8})} end),
    ok = wait_until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) >= 2 end, 5000),
    os:cmd("kill -9 " ++ integer_to_list(kem_port:os_pid(Port))),
    receive {lost, Result} -> ?assertMatch({error, {_, _}}, Result) after 20000 -> error(no_answer) end,
    ?assertEqual([], payload_files()),
    ok = wait_until(fun() -> (catch kem:execute(?DOUBLE, <<1, 3, 5, 7>>, #{})) =:= {ok, <<2, 6, 10, 14>>} end, 10000),
    Again = crypto:strong_rand_bytes(?SLOT_MIN + 3),
    ?assertEqual({ok, kem_ref:double_ref(Again, 6)}, kem:execute(?DOUBLE, Again, #{output_size => 6})).

%%% when /dev/shm fails: the pipe, never a failed start or a crash

unusable_root_test_() ->
    {setup, fun() -> start([{shm_root, "/proc/version"}, {shm_threshold, 1024}]) end, fun stop/1,
     [{timeout, 60, fun() -> large_calls_take_the_pipe(undefined) end}]}.

read_only_test_() ->
    tmpfs_fixture("ro,size=1m", fun() -> large_calls_take_the_pipe(undefined) end).

full_test_() ->
    tmpfs_fixture("size=64k", fun full_shm_falls_back_to_the_pipe/0).

%% The same through kept part files (kem_shm_slots): what could not be
%% written is deleted, and the call answered through the pipe.
full_slots_test_() ->
    tmpfs_fixture("size=64k", [{shm_slot_threshold, 16384}], fun full_shm_falls_back_to_the_pipe/0).

%% A tmpfs of our own for /dev/shm's failures (needs root; CI runs as root:
%% without it the fixture says so and tests nothing).
tmpfs_fixture(Options, Test) ->
    tmpfs_fixture(Options, [], Test).

tmpfs_fixture(Options, Env, Test) ->
    {setup,
     fun() ->
         Mount = filename:join("/tmp", "kem_shm_mount_" ++ os:getpid()),
         ok = filelib:ensure_dir(filename:join(Mount, "x")),
         case os:cmd("mount -t tmpfs -o " ++ Options ++ " kem_test " ++ Mount ++ " 2>&1 && echo mounted") of
             "mounted\n" ->
                 {Mount, start([{shm_root, Mount}, {shm_threshold, 16384} | Env])};
             Why ->
                 io:format(user, "~nkem_shm_tests: cannot mount a tmpfs (~s); skipped~n", [string:trim(Why)]),
                 {Mount, none}
         end
     end,
     fun({Mount, Apps}) ->
         _ = Apps =/= none andalso stop(Apps),
         os:cmd("umount " ++ Mount),
         file:del_dir(Mount)
     end,
     fun({_, none}) -> [];
        ({_, _}) -> [{timeout, 60, Test}]
     end}.

large_calls_take_the_pipe(ExpectedDir) ->
    ?assertEqual(ExpectedDir, kem_shm_dir:path()),
    [begin
         Input = crypto:strong_rand_bytes(Size),
         ?assertEqual({ok, kem_ref:double_ref(Input, Size * 2)},
                      kem:execute(?DOUBLE, Input, #{output_size_hint => 2}))
     end || Size <- [20000, 100003, 1 bsl 20]].

full_shm_falls_back_to_the_pipe() ->
    Dir = kem_shm_dir:path(),
    ?assert(is_list(Dir)),
    {ok, #{kem_port_1 := Before}} = kem:stats(),
    %% 20 KB in fits the 64 KB tmpfs, 80 KB out does not: the port cannot
    %% write the result there, and the call is made again through the pipe.
    Small = crypto:strong_rand_bytes(20000),
    ?assertEqual({ok, kem_ref:double_ref(Small, 80000)}, kem:execute(?DOUBLE, Small, #{output_size_hint => 4})),
    %% 200 KB in does not fit: straight to the pipe.
    Big = crypto:strong_rand_bytes(200000),
    ?assertEqual({ok, kem_ref:double_ref(Big, 200000)}, kem:execute(?DOUBLE, Big, #{})),
    {ok, #{kem_port_1 := After}} = kem:stats(),
    ?assert(maps:get(calls, After) - maps:get(calls, Before) >= 3),
    ?assertEqual({ok, ["owner"]}, file:list_dir(Dir)).
