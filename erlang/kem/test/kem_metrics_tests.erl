%%% @doc The metrics page as Prometheus reads it: a real app (two port
%%% groups on one adapter, so the port-group families have samples) makes
%%% real calls (kernels, a grouped burst, a refused call, adapter_info),
%%% then `promtool check metrics' (Debian's prometheus package, installed
%%% by scripts/setup) must accept `kem:metrics/0''s page: one HELP and TYPE
%%% per family, no family twice, counters ending in _total. Also: only
%%% kernel calls count in kem_bytes_in_total/kem_bytes_out_total.
-module(kem_metrics_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).

metrics_test_() ->
    {setup, fun start/0, fun kem_test_app:stop/1,
     [{timeout, 120, fun promtool_accepts_the_page/0},
      {timeout, 60, fun only_kernel_calls_count_bytes/0},
      {timeout, 60, fun every_family_once/0}]}.

start() ->
    kem_test_app:start([{adapters, [0, 0]}, {weights, #{0 => 1}}]).

%% The page after calls of every kind a node sees, checked by promtool.
promtool_accepts_the_page() ->
    Promtool = promtool(),
    make_calls(),
    {ok, Page} = kem:metrics(),
    %% Families that must have samples, so promtool sees every kind of line.
    [?assertMatch({Name, {_, _}}, {Name, binary:match(Page, Name)})
     || Name <- [<<"kem_calls_total{method=\"execute\"}">>, <<"kem_call_duration_seconds_bucket{">>,
                 <<"kem_errors_total{reason=\"kernel_not_found\"}">>, <<"kem_group_calls_total{group=">>,
                 <<"kem_group_frame_calls_total{port=">>,
                 <<"kem_port_starts_total{port=">>]],
    File = filename:join("/tmp", "kem_metrics_" ++ os:getpid() ++ ".prom"),
    ok = file:write_file(File, Page),
    try
        {Status, Said} = run(Promtool ++ " check metrics < " ++ File),
        ?assertEqual({0, ""}, {Status, Said})
    after
        file:delete(File)
    end.

%% adapter_info's reply (a JSON document, ~1 KB) is not a kernel's output:
%% it moves neither byte counter; a kernel call of 100 bytes moves both by 100.
only_kernel_calls_count_bytes() ->
    Before = bytes(),
    {ok, Info} = kem:adapter_info(),
    ?assert(byte_size(Info) > 0),
    {ok, pong} = kem:ping(),
    ?assertEqual(Before, bytes()),
    {ok, Out} = kem:execute(?DOUBLE, crypto:strong_rand_bytes(100), #{}),
    ?assertEqual(100, byte_size(Out)),
    {In0, Out0} = Before,
    ?assertEqual({In0 + 100, Out0 + 100}, bytes()).

%% Each family's HELP and TYPE once (what promtool refused before: two
%% kem_group_calls_total families), checked without promtool too.
every_family_once() ->
    {ok, Page} = kem:metrics(),
    Types = [Name || <<"# TYPE ", Rest/binary>> <- binary:split(Page, <<"\n">>, [global]),
                     [Name, _] <- [binary:split(Rest, <<" ">>)]],
    ?assertEqual(lists:sort(Types), lists:usort(Types)),
    ?assert(length(Types) > 10).

%%% helpers

promtool() ->
    case os:find_executable("promtool") of
        false -> error({promtool_missing, "promtool is not on PATH: scripts/setup installs it "
                                          "(Debian's prometheus package)"});
        Path -> Path
    end.

%% Kernel calls on the group the kernel hashes to, a burst that the port
%% owner sends as group frames (it is suspended while the callers queue,
%% as kem_group_tests does), a refused call and adapter_info.
make_calls() ->
    [{ok, _} = kem:execute(?DOUBLE, crypto:strong_rand_bytes(64), #{}) || _ <- lists:seq(1, 5)],
    {error, {kernel_not_found, _}} = kem:execute(<<"nope">>, <<1, 2, 3, 4>>, #{}),
    {ok, _} = kem:adapter_info(),
    Owners = kem_sup:port_names(),
    [ok = sys:suspend(O) || O <- Owners],
    Parent = self(),
    Input = crypto:strong_rand_bytes(64),
    %% execute_kernel, not execute: calls with an opts map never go in groups.
    Burst = fun() -> kem:call(execute_kernel, {?DOUBLE, Input, 1}, 30000) end,
    Pids = [spawn_link(fun() -> Parent ! {self(), Burst()} end) || _ <- lists:seq(1, 6)],
    wait_queued(Owners, 6, 100),
    [ok = sys:resume(O) || O <- Owners],
    Want = {ok, kem_ref:double_ref(Input, 64)},
    [?assertEqual(Want, receive {P, R} -> R after 30000 -> no_reply end) || P <- Pids],
    ok.

wait_queued(_Owners, _N, 0) -> ok;
wait_queued(Owners, N, Tries) ->
    Queued = lists:sum([element(2, process_info(whereis(O), message_queue_len)) || O <- Owners]),
    case Queued >= N of
        true -> ok;
        false -> timer:sleep(20), wait_queued(Owners, N, Tries - 1)
    end.

bytes() ->
    Snap = kem_metrics:snapshot(),
    {proplists:get_value(bytes_in, Snap, 0), proplists:get_value(bytes_out, Snap, 0)}.

%% A shell command's exit status and what it wrote (stdout and stderr).
run(Command) ->
    Said = os:cmd(Command ++ " 2>&1; echo \"exit=$?\""),
    [Status | Rest] = lists:reverse(string:split(string:trim(Said, trailing), "\n", all)),
    "exit=" ++ N = Status,
    {list_to_integer(N), lists:flatten(lists:join("\n", lists:reverse(Rest)))}.
