%%% @doc Faults with two ports: a runaway kernel on one port must not
%%% disturb the other, and the stuck port is replaced. Prints the figures
%%% docs/reliability.md records.
-module(kem_faults_tests).
-include_lib("eunit/include/eunit.hrl").

-define(RUNAWAY, <<"
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<atomic<u32>>;
@compute @workgroup_size(64)
fn main() {
    for (var turn = 0u; turn < 65535u; turn = turn + 1u) {
        atomicAdd(&output_words[0], input_words[0] + 1u);
    }
}
">>).

faults_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 120, fun runaway_kernel_is_contained/0},
      {timeout, 120, fun crash_figures/0}]}.

start() ->
    Dir = filename:join("/tmp", "kem_faults_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    ok = file:write_file(filename:join(Dir, "runaway.wgsl"), ?RUNAWAY),
    ok = application:load(kem),
    ok = application:set_env(kem, ports, 2),
    ok = application:set_env(kem, kernel_dir, Dir),
    {ok, Apps} = application:ensure_all_started(kem),
    {Apps, Dir}.

stop({Apps, Dir}) ->
    [application:stop(A) || A <- lists:reverse(Apps)],
    application:unload(kem),
    file:del_dir_r(Dir),
    ok.

now_ms() -> erlang:monotonic_time(millisecond).

%% Calls on kem_port_2 in a loop until told to stop; returns {ok, Errors}.
background_caller(Parent) ->
    spawn_link(fun() -> Parent ! {self(), caller_loop(0, 0)} end).

caller_loop(Ok, Err) ->
    receive stop -> {Ok, Err}
    after 0 ->
        case kem_port:call(kem_port_2, execute_kernel, {<<"double">>, <<1, 3, 5, 7>>, 1}, 5000) of
            {ok, <<2, 6, 10, 14>>} -> caller_loop(Ok + 1, Err);
            _ -> caller_loop(Ok, Err + 1)
        end
    end.

runaway_kernel_is_contained() ->
    Stuck = kem_port:os_pid(kem_port_1),
    Caller = background_caller(self()),
    T0 = now_ms(),
    Result = kem_port:call(kem_port_1, execute, {<<"runaway">>, <<0:32>>, #{workgroups => {65535, 65535, 1}}}, 1000),
    TimedOut = now_ms(),
    ?assertMatch({error, {timeout, _}}, Result),
    ok = wait_ping(kem_port_1, 10000),
    Back = now_ms(),
    timer:sleep(200),
    Caller ! stop,
    {Ok, Err} = receive {Caller, R} -> R end,
    NewPid = kem_port:os_pid(kem_port_1),
    io:format(user, "~nrunaway: timeout after ~b ms; port 1 back ~b ms later (new OS pid ~p, old ~p ~s); "
                    "port 2 meanwhile: ~b calls ok, ~b errors~n",
              [TimedOut - T0, Back - TimedOut, NewPid, Stuck, alive(Stuck), Ok, Err]),
    ?assertNotEqual(Stuck, NewPid),
    ?assertEqual(0, Err),
    ?assert(Ok > 0),
    timer:sleep(2500),  % the owner's kill -9 backstop has run by now
    ?assertEqual("gone", alive(Stuck)).

alive(OsPid) ->
    case os:cmd("kill -0 " ++ integer_to_list(OsPid) ++ " 2>&1") of
        "" -> "still running";
        _ -> "gone"
    end.

wait_ping(Port, Left) when Left =< 0 -> {timeout, Port};
wait_ping(Port, Left) ->
    case catch kem_port:call(Port, ping, {}, 500) of
        {ok, pong} -> ok;
        _ -> timer:sleep(10), wait_ping(Port, Left - 10)
    end.

%% kill -9 with 100 calls in flight on one port: every caller answered,
%% how fast, and when the port serves again.
crash_figures() ->
    OsPid = kem_port:os_pid(kem_port_1),
    Parent = self(),
    Input = crypto:strong_rand_bytes(1 bsl 20),
    Expected = double_ref(Input),
    Callers = [spawn_link(fun() ->
                   R = kem_port:call(kem_port_1, execute_kernel, {<<"double">>, Input, 1}, 30000),
                   Parent ! {self(), now_ms(), R}
               end) || _ <- lists:seq(1, 100)],
    timer:sleep(30),
    Killed = now_ms(),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Answers = [receive {C, T, R} -> {T, R} after 10000 -> {never, none} end || C <- Callers],
    Last = lists:max([T || {T, _} <- Answers, is_integer(T)]),
    ok = wait_ping(kem_port_1, 10000),
    Back = now_ms(),
    Errors = length([x || {_, {error, _}} <- Answers]),
    Right = length([x || {_, {ok, Out}} <- Answers, Out =:= Expected]),
    Wrong = length([x || {_, {ok, Out}} <- Answers, Out =/= Expected]),
    io:format(user, "~ncrash: 100 in flight, kill -9: ~b errors, ~b right answers (finished before the kill), "
                    "~b wrong, ~b unanswered; last answer ~b ms after the kill; service back after ~b ms~n",
              [Errors, Right, Wrong, length([x || {never, _} <- Answers]), Last - Killed, Back - Killed]),
    ?assertEqual(100, Errors + Right),
    ?assertEqual(0, Wrong),
    ?assert(Last - Killed =< 1000),
    ?assert(Back - Killed =< 2000).

double_ref(Input) -> kem_ref:double_ref(Input, byte_size(Input)).
