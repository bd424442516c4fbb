%%% @doc Warm spares and warm restarts (kem_spare, kem_warm): a killed or
%%% timed-out port is replaced by a spare that is already open and warm.
%%% Prints the figures docs/reliability.md records (times are figures, not
%%% assertions).
-module(kem_spare_tests).
-include_lib("eunit/include/eunit.hrl").

-define(SMALL, <<1, 3, 5, 7>>).

spare_test_() ->
    {setup, fun() -> start(#{ports => 2, spares => 1}) end, fun stop/1,
     [{timeout, 120, fun kill_with_calls_in_flight/0},
      {timeout, 120, fun runaway_timeout/0},
      {timeout, 180, fun runaway_flood_leaves_bystanders_answered/0},
      {timeout, 120, fun warm_restart_figures/0},
      {timeout, 60, fun idle_spare_cost/0},
      {timeout, 120, fun a_spare_that_dies_is_replaced/0},
      {timeout, 120, fun a_killed_port_leaves_no_process_nor_file/0},
      {timeout, 60, fun app_stop_leaves_no_process_behind/0}]}.

no_spare_test_() ->
    {setup, fun() -> start(#{ports => 1, spares => 0}) end, fun stop/1,
     [{timeout, 120, fun without_spares_the_port_still_restarts/0}]}.

start(Env) ->
    Kernels = [{"runaway", kem_test_app:runaway_kernel()}, {"heavy_a", heavy_kernel(1)}, {"heavy_b", heavy_kernel(2)}],
    kem_test_app:start_with_kernels("kem_spare", Kernels,
                                    maps:to_list(Env#{port_env => [{"KEM_TEST_HOOKS", "1"}]})).

stop(Started) ->
    kem_test_app:stop_with_kernels(Started).

%%% the tests

%% kill -9 with 100 calls in flight: every caller answered; the spare
%% takes over; time from the kill to the first successful call.
kill_with_calls_in_flight() ->
    Spare = ready_spare(),
    OsPid = kem_port:os_pid(kem_port_1),
    Parent = self(),
    %% 64 KiB: the figure is the restart, not 100 MiB moving through a pipe.
    Input = crypto:strong_rand_bytes(64 bsl 10),
    Expected = kem_ref:double_ref(Input, byte_size(Input)),
    %% The GPU thread sleeps (a test hook): the 100 calls queue behind it in
    %% the port, all in flight when it is killed. 10 s, though the port is
    %% killed sooner: 100 callers reaching a loaded machine's port can take
    %% seconds, and a hook that ended first would let them be answered.
    spawn(fun() -> kem_port:call(kem_port_1, test_hook, {sleep_gpu, 10000}, 30000) end),
    ok = all_reached(kem_port_1, 1, now_ms() + 5000),  % the hook first
    Callers = [spawn_link(fun() ->
                   Parent ! {self(), kem_port:call(kem_port_1, execute_kernel, {<<"double">>, Input, 1}, 30000)}
               end) || _ <- lists:seq(1, 100)],
    ok = all_reached(kem_port_1, 101, now_ms() + 20000),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Killed = now_ms(),  % when kill(1) returned: forking its shell took 9-107 ms on the 2-core box
    Back = first_success(kem_port_1, Killed + 10000),
    Answers = [receive {C, R} -> R after 10000 -> no_reply end || C <- Callers],
    Right = length([x || {ok, Out} <- Answers, Out =:= Expected]),
    Errors = [R || {error, {Reason, _}} = R <- Answers, is_atom(Reason)],
    io:format(user, "~nspare, kill -9 with 100 in flight: ~b errors, ~b right; first successful call "
                    "~b ms after the kill (spare OS pid ~p took over: ~p)~n",
              [length(Errors), Right, Back - Killed, Spare, kem_port:os_pid(kem_port_1) =:= Spare]),
    ?assertEqual(100, length(Errors) + Right),
    ?assert(length(Errors) > 0),
    ?assertEqual(Spare, kem_port:os_pid(kem_port_1)).

%% A runaway kernel's timeout kills its port; the spare serves at once and
%% the stuck process is gone without anyone waiting for it.
runaway_timeout() ->
    %% Admitted first (one small dispatch): a call whose new kernel is still
    %% compiling in the guard when it times out keeps its port (kem_timeout).
    {ok, _} = kem_port:call(kem_port_1, execute, {<<"runaway">>, <<0:32>>, #{workgroups => {1, 1, 1}}}, 60000),
    Spare = ready_spare(),
    Stuck = kem_port:os_pid(kem_port_1),
    %% 2 s: the call must be on the GPU when its timer fires (then the port
    %% is killed); under load the port may not have read it within 500 ms.
    Result = kem_port:call(kem_port_1, execute, {<<"runaway">>, <<0:32>>, #{workgroups => {16384, 64, 1}}}, 2000),
    TimedOut = now_ms(),
    ?assertMatch({error, {timeout, _}}, Result),
    Back = first_success(kem_port_1, TimedOut + 10000),
    Gone = wait_gone(Stuck, now_ms() + 5000),
    io:format(user, "~nspare, runaway: first successful call ~b ms after the timeout; "
                    "old process gone ~b ms after it~n", [Back - TimedOut, Gone - TimedOut]),
    ?assertEqual(Spare, kem_port:os_pid(kem_port_1)).

%% Runaway kernels one after another on a 2-port app while bystanders call
%% `double' on random inputs: every bystander call gets the right bytes or
%% a clear error, and most get results.
runaway_flood_leaves_bystanders_answered() ->
    _ = ready_spare(),
    Parent = self(),
    Bystanders = [spawn_link(fun() -> Parent ! {self(), bystander(0, [])} end) || _ <- lists:seq(1, 4)],
    Started = now_ms(),
    Runaways = [kem:call(execute, {<<"runaway">>, <<0:32>>, #{workgroups => {16384, 64, 1}}}, 300)
                || _ <- lists:seq(1, 6)],
    Elapsed = now_ms() - Started,
    [B ! stop || B <- Bystanders],
    Results = lists:append([receive {B, R} -> R after 30000 -> [no_reply] end || B <- Bystanders]),
    Ok = length([x || ok <- Results]),
    Wrong = length([x || wrong <- Results]),
    Clear = [E || {error, {Reason, Detail}} = E <- Results, is_atom(Reason), is_binary(Detail)],
    Reasons = lists:usort([R || {error, {R, _}} <- Clear]),
    io:format(user, "~nspare, 6 runaways in ~b ms on 2 ports: bystanders ~b right, ~b clear errors ~0p, ~b wrong~n",
              [Elapsed, Ok, length(Clear), Reasons, Wrong]),
    %% Each runaway: its timeout, or (sent again after its port was
    %% restarted under it, kem_port) a clear restart error.
    ?assertEqual([], [R || R <- Runaways, not lists:member(element(1, element(2, R)), [timeout, port_restarted, port_unavailable])]),
    ?assertEqual(0, Wrong),
    ?assertEqual(length(Results), Ok + length(Clear)),
    ?assert(Ok > length(Clear)).

bystander(Calls, Acc) ->
    receive stop -> Acc
    after 0 ->
        Input = crypto:strong_rand_bytes(1 + rand:uniform(4096)),
        Hint = rand:uniform(2),
        Outcome = case kem:execute(<<"double">>, Input, #{output_size_hint => Hint, timeout => 10000}) of
            {ok, Out} ->
                case kem_ref:double_ref(Input, byte_size(Input) * Hint) of
                    Out -> ok;
                    _ -> wrong
                end;
            Error -> Error
        end,
        bystander(Calls + 1, [Outcome | Acc])
    end.

%% Restart to first call of a kernel with a visible compile: one the group
%% served before (on the warm list: the spare compiled it) and one it never
%% served (compiled on its first call).
warm_restart_figures() ->
    Started = now_ms(),
    ?assertEqual({ok, kem_ref:double_ref(?SMALL, 4)}, kem_port:call(kem_port_1, execute_kernel, {<<"heavy_a">>, ?SMALL, 1}, 30000)),
    FirstCompile = now_ms() - Started,
    ok = wait_listed({<<"heavy_a">>, <<"main">>, false}, now_ms() + 5000),
    _ = ready_spare(),
    Warm = restart_then_call(<<"heavy_a">>),
    _ = ready_spare(),
    Cold = restart_then_call(<<"heavy_b">>),
    io:format(user, "~nwarm restart: kill -> first call of a served kernel ~b ms (warm list), "
                    "of a kernel never served ~b ms (cold compile); its first compile in a live port ~b ms~n",
              [Warm, Cold, FirstCompile]).

restart_then_call(Kernel) ->
    OsPid = kem_port:os_pid(kem_port_1),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Killed = now_ms(),  % when kill(1) returned: forking its shell took 9-107 ms on the 2-core box
    first_success(kem_port_1, Kernel, Killed + 30000) - Killed.

%% An idle spare blocks on its pipe: its memory, and CPU over 2 s (the
%% script measures 10 s), and GPU memory where nvidia-smi exists.
idle_spare_cost() ->
    Spare = ready_spare(),
    timer:sleep(500),
    {Rss, Cpu} = idle_cost(Spare, 2000),
    io:format(user, "~nidle spare (OS pid ~p): RSS ~b KiB, CPU ~.1f ms over 2 s~n", [Spare, Rss, Cpu]),
    ?assert(Rss > 0),
    ?assertMatch([#{rss_kib := Kib} | _] when is_integer(Kib), kem_spare:info()),
    ?assert(Cpu < 200.0).  % busy-waiting would be ~2000 ms

%% A spare killed while idle is replaced, and the next restart takes the
%% new one.
a_spare_that_dies_is_replaced() ->
    Dead = ready_spare(),
    os:cmd("kill -9 " ++ integer_to_list(Dead)),
    New = ready_spare_but(Dead, now_ms() + 60000),
    ?assertNotEqual(Dead, New),
    os:cmd("kill -9 " ++ integer_to_list(kem_port:os_pid(kem_port_2))),
    _ = first_success(kem_port_2, now_ms() + 20000),
    ?assertEqual(New, kem_port:os_pid(kem_port_2)).

%% The owner acts on the end of file (kem_port), before the process is
%% reaped: still, once every caller has its answer, the killed process is
%% reaped (no zombie, no orphan) and no payload file is left in the
%% shared-memory directory. 1 MiB inputs go through it (shm_threshold).
a_killed_port_leaves_no_process_nor_file() ->
    _ = ready_spare(),
    OsPid = kem_port:os_pid(kem_port_1),
    Dir = kem_shm_dir:path(),
    ?assert(is_list(Dir) orelse is_binary(Dir)),
    Parent = self(),
    [spawn(fun() -> kem_port:call(P, test_hook, {sleep_gpu, 1500}, 30000) end) || P <- kem_sup:port_names()],
    ok = all_reached(kem_port_1, 1, now_ms() + 5000),
    Callers = [spawn_link(fun() ->
                   Input = crypto:strong_rand_bytes(1 bsl 20),
                   Result = kem:execute(<<"double">>, Input, #{timeout => 30000}),
                   Parent ! {self(), case Result of
                                         {ok, Out} -> Out =:= kem_ref:double_ref(Input, 1 bsl 20);
                                         {error, {Reason, Detail}} -> is_atom(Reason) andalso is_binary(Detail)
                                     end}
               end) || _ <- lists:seq(1, 8)],
    ok = all_reached(kem_port_1, 2, now_ms() + 20000),  % some of them wait in port 1
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Answers = [receive {C, Fine} -> Fine after 30000 -> no_reply end || C <- Callers],
    Reaped = wait_reaped(OsPid, now_ms() + 10000),
    Left = wait_no_files(Dir, now_ms() + 10000),
    io:format(user, "~nkilled port: 8 callers answered ~0p; process reaped (not a zombie) ~b ms after the "
                    "kill; payload files left: ~0p~n", [Answers, Reaped, Left]),
    ?assertEqual(lists:duplicate(8, true), Answers),
    ?assertEqual([], Left).

%% Stopping the app ends every Python process: ports and spares.
app_stop_leaves_no_process_behind() ->
    Spare = ready_spare(),
    Ports = [kem_port:os_pid(P) || P <- kem_sup:port_names()],
    ok = application:stop(kem),
    [wait_gone(P, now_ms() + 5000) || P <- [Spare | Ports]].

%% spares = 0: the old path (a fresh port opens after a kill) still works.
without_spares_the_port_still_restarts() ->
    ?assertEqual([], kem_spare:info()),
    OsPid = kem_port:os_pid(kem_port_1),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Killed = now_ms(),  % when kill(1) returned: forking its shell took 9-107 ms on the 2-core box
    Back = first_success(kem_port_1, Killed + 20000),
    io:format(user, "~nno spare: first successful call ~b ms after the kill~n", [Back - Killed]),
    ?assertNotEqual(OsPid, kem_port:os_pid(kem_port_1)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, ?SMALL, #{})).

%%% helpers

now_ms() -> erlang:monotonic_time(millisecond).

%% Wait until a spare has finished warming; its OS pid.
ready_spare() ->
    ready_spare(now_ms() + 60000).

ready_spare(Deadline) ->
    case [P || #{os_pid := P, stage := ready} <- kem_spare:info()] of
        [Pid | _] -> Pid;
        [] ->
            ?assert(now_ms() < Deadline),
            timer:sleep(20),
            ready_spare(Deadline)
    end.

wait_listed(Shape, Deadline) ->
    case lists:member(Shape, kem_spare:shapes()) of
        true -> timer:sleep(20), ok;  % the spare's refresh is under way
        false ->
            ?assert(now_ms() < Deadline),
            timer:sleep(5),
            wait_listed(Shape, Deadline)
    end.

ready_spare_but(Dead, Deadline) ->
    case ready_spare(Deadline) of
        Dead -> timer:sleep(20), ready_spare_but(Dead, Deadline);
        Pid -> Pid
    end.

%% The time of the first call on Port that returns the right bytes.
first_success(Port, Deadline) ->
    first_success(Port, <<"double">>, Deadline).

first_success(Port, Kernel, Deadline) ->
    case kem_port:call(Port, execute_kernel, {Kernel, ?SMALL, 1}, 30000) of
        {ok, <<2, 6, 10, 14>>} -> now_ms();
        _ ->
            ?assert(now_ms() < Deadline),
            timer:sleep(1),
            first_success(Port, Kernel, Deadline)
    end.

all_reached(Port, N, Deadline) ->
    #{pending := Pending} = sys:get_state(Port),
    {message_queue_len, Answered} = process_info(self(), message_queue_len),
    case maps:size(Pending) + Answered >= N of
        true -> ok;
        false ->
            ?assert(now_ms() < Deadline),
            timer:sleep(2),
            all_reached(Port, N, Deadline)
    end.

wait_gone(OsPid, Deadline) ->
    case filelib:is_dir("/proc/" ++ integer_to_list(OsPid)) andalso not zombie(OsPid) of
        false -> now_ms();
        true ->
            ?assert(now_ms() < Deadline),
            timer:sleep(5),
            wait_gone(OsPid, Deadline)
    end.

%% When /proc has no entry for the process any more (a zombie still has one).
wait_reaped(OsPid, Deadline) ->
    Start = now_ms(),
    wait_reaped(OsPid, Start, Deadline).

wait_reaped(OsPid, Start, Deadline) ->
    case filelib:is_dir("/proc/" ++ integer_to_list(OsPid)) of
        false -> now_ms() - Start;
        true ->
            ?assert(now_ms() < Deadline),
            timer:sleep(5),
            wait_reaped(OsPid, Start, Deadline)
    end.

%% The payload files in the shared-memory directory (its `owner' marker
%% aside), once there are none or the deadline passed.
wait_no_files(Dir, Deadline) ->
    {ok, Names} = file:list_dir(Dir),
    case [N || N <- Names, N =/= "owner"] of
        [] -> [];
        Left ->
            case now_ms() < Deadline of
                true -> timer:sleep(20), wait_no_files(Dir, Deadline);
                false -> Left
            end
    end.

zombie(OsPid) ->
    case file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/stat") of
        {ok, Stat} -> binary:match(Stat, <<") Z ">>) =/= nomatch;
        _ -> true
    end.

%% {RSS KiB, CPU ms over Ms} of an OS process, from /proc.
idle_cost(OsPid, Ms) ->
    Before = cpu_ticks(OsPid),
    timer:sleep(Ms),
    After = cpu_ticks(OsPid),
    {ok, Status} = file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/status"),
    {match, [Rss]} = re:run(Status, "VmRSS:\\s+(\\d+)", [{capture, all_but_first, list}]),
    {list_to_integer(Rss), (After - Before) * 1000 / 100}.  % USER_HZ = 100 on Linux

cpu_ticks(OsPid) ->
    {ok, Stat} = file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/stat"),
    [_, AfterName] = binary:split(Stat, <<") ">>),
    Fields = binary:split(AfterName, <<" ">>, [global]),
    %% utime and stime are fields 14 and 15 of /proc/PID/stat, 12 and 13 after the name.
    binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)).

%% A kernel that doubles its input and carries a long never-taken branch,
%% so that it takes a visible time to compile.
heavy_kernel(Salt) ->
    Body = [io_lib:format("        acc = (acc * 1664525u + ~bu) ^ (acc >> ~bu);~n", [I * Salt, I rem 31 + 1])
            || I <- lists:seq(1, 2000)],
    iolist_to_binary([<<"
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i >= arrayLength(&output_words)) { return; }
    var value = 0u;
    if (i < arrayLength(&input_words)) { value = input_words[i]; }
    var out = value * 2u;
    if (i == 0xFFFFFFFFu && value == 7u) {
        var acc = value;
">>, Body, <<"
        out = acc;
    }
    output_words[i] = out;
}
">>]).
